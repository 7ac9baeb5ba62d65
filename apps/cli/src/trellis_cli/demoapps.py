"""The demo's programs, each run as its own process by ``trellis up``.

``app``: a bookstore version answering who it is and who called it (the caller's SPIFFE id from the
sidecar's ``x-forwarded-client-cert``). ``greeter``: a gRPC server (examples/grpc's greeter)
whose every method answers who it is and which method was called. ``client``: bookbuyer or
bookthief, calling bookstore through its own sidecar a few times a second and counting what
comes back (which version answered, or denied, or errors) in a small JSON file that
``trellis up`` prints as a live counter.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections import Counter
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import httpx


class _Book(BaseHTTPRequestHandler):
    disable_nagle_algorithm = True
    protocol_version = "HTTP/1.1"
    server: _BookServer

    def do_GET(self) -> None:
        body = json.dumps(
            {
                "app": self.server.name,
                "path": self.path,
                "caller": self.headers.get("x-forwarded-client-cert", ""),
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class _BookServer(ThreadingHTTPServer):
    daemon_threads = True
    name = ""


def run_app(name: str, port: int) -> None:
    server = _BookServer(("127.0.0.1", port), _Book)
    server.name = name
    # shutdown() waits for serve_forever() to return: call it from another thread, never
    # from a handler running on the thread that serves (that deadlocks).
    signal.signal(
        signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()
    )
    print(f"{name} listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


def run_greeter(name: str, port: int) -> None:
    class Greeter(grpc.GenericRpcHandler):
        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes]:
            reply = json.dumps({"app": name, "method": details.method}).encode()
            return grpc.unary_unary_rpc_method_handler(lambda request, context: reply)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((Greeter(),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(grace=1))
    print(f"{name} (gRPC) listening on 127.0.0.1:{port}", flush=True)
    server.wait_for_termination()


def outcome(response: httpx.Response) -> str:
    if response.status_code == 200:
        try:
            return str(response.json().get("app", "ok"))
        except ValueError:
            return "ok"
    if response.status_code in (403, 404):
        return "denied"
    return f"http-{response.status_code}"


def run_client(
    name: str, proxy_port: int, host: str, path: str, counter: Path, rate: float
) -> None:
    counts: Counter[str] = Counter()
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    written = time.monotonic()
    with httpx.Client(timeout=2.0) as client:
        while running:
            try:
                counts[
                    outcome(
                        client.get(f"http://127.0.0.1:{proxy_port}{path}", headers={"host": host})
                    )
                ] += 1
            except httpx.HTTPError:
                counts["error"] += 1
            if time.monotonic() - written > 0.5:
                tmp = counter.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"client": name, "counts": counts, "at": time.time()}))
                tmp.replace(counter)
                written = time.monotonic()
            time.sleep(1.0 / rate)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trellis_cli.demoapps")
    sub = parser.add_subparsers(dest="program", required=True)
    app = sub.add_parser("app")
    app.add_argument("--name", required=True)
    app.add_argument("--port", type=int, required=True)
    greeter = sub.add_parser("greeter")
    greeter.add_argument("--name", required=True)
    greeter.add_argument("--port", type=int, required=True)
    client = sub.add_parser("client")
    client.add_argument("--name", required=True)
    client.add_argument("--proxy-port", type=int, required=True)
    client.add_argument("--host", required=True)
    client.add_argument("--path", default="/books-bought")
    client.add_argument("--counter", type=Path, required=True)
    client.add_argument("--rate", type=float, default=10.0, help="requests per second")
    args = parser.parse_args(argv)
    if args.program == "app":
        run_app(args.name, args.port)
    elif args.program == "greeter":
        run_greeter(args.name, args.port)
    else:
        run_client(args.name, args.proxy_port, args.host, args.path, args.counter, args.rate)


if __name__ == "__main__":
    main()
