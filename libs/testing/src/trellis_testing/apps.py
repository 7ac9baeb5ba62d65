"""Tiny applications for mesh tests: HTTP ones answer who they are and who called them; TCP
ones say their name."""

from __future__ import annotations

import json
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True  # else Nagle + delayed ACK add ~40 ms per request
    protocol_version = "HTTP/1.1"
    server: AppServer

    def do_GET(self) -> None:
        self.server.requests += 1
        if self.server.delay:
            time.sleep(self.server.delay)
        if self.server.take_failure():
            self.send_response(503)
            self.send_header("content-length", "0")
            self.end_headers()
            return
        body = json.dumps(
            {
                "app": self.server.name,
                "path": self.path,
                "caller": self.headers.get("x-forwarded-client-cert", ""),
                "headers": {k.lower(): v for k, v in self.headers.items()},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class AppServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.name = name
        self.requests = 0
        self.fail_next = 0  # answer this many of the next requests 503 (retry tests)
        self.delay = 0.0  # seconds each request waits before its answer (load tests)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def take_failure(self) -> bool:
        with self._lock:
            if self.fail_next > 0:
                self.fail_next -= 1
                return True
            return False

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> AppServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _NameHandler(socketserver.BaseRequestHandler):
    server: TcpApp

    def handle(self) -> None:
        self.server.connections += 1
        self.request.sendall(f"{self.server.name}\n".encode())


class TcpApp(socketserver.ThreadingTCPServer):
    """A TCP application: each connection gets the app's name and a newline."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _NameHandler)
        self.name = name
        self.connections = 0
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> TcpApp:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
