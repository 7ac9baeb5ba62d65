"""Test helpers for the CLI: admin APIs with canned answers, over real HTTP.

:class:`CannedAdmin` serves, from a thread on 127.0.0.1, the answers a test gives it for
``(method, path)`` (any other path is a 404 with a JSON ``detail``), and writes the state
directory entries that point the CLI's services at it. It lets a test check what the CLI
does with each kind of answer (404, 422, 503, a body that is not JSON) through its real
HTTP client; what the services really answer is checked by the integration tests, with the
services themselves.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from trellis_common import statefile


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: Any = field(default_factory=dict)  # JSON, or bytes sent as they are


@dataclass(frozen=True)
class Received:
    """A request the canned server got: what the CLI sent."""

    method: str
    path: str
    authorization: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class CannedAdmin:
    def __init__(self, answers: dict[tuple[str, str], Answer]) -> None:
        self.answers = answers
        self.received: list[Received] = []
        canned = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                path = urlsplit(self.path).path
                length = int(self.headers.get("Content-Length") or 0)
                canned.received.append(
                    Received(
                        self.command,
                        path,
                        self.headers.get("Authorization", ""),
                        self.rfile.read(length),
                    )
                )
                answer = canned.answers.get(
                    (self.command, path), Answer(404, {"detail": f"no route {path}"})
                )
                data = answer.body if isinstance(answer.body, bytes) else json.dumps(answer.body)
                payload = data if isinstance(data, bytes) else data.encode()
                self.send_response(answer.status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # shutdown() waits for the loop's next poll: at the default 0.5 s, half a second per
        # test that serves a canned answer
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def serve(self, state_dir: Path, *services: str) -> None:
        """Point ``services`` of the mesh in ``state_dir`` at this server."""
        for name in services:
            statefile.write_endpoint(
                state_dir, statefile.ServiceEndpoint(name, self.url, "127.0.0.1:0", os.getpid())
            )

    def __enter__(self) -> CannedAdmin:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)


def unreachable(state_dir: Path, *services: str, port: int = 9) -> None:
    """Point ``services`` at a closed port (9, discard: nothing listens there)."""
    for name in services:
        statefile.write_endpoint(
            state_dir,
            statefile.ServiceEndpoint(name, f"http://127.0.0.1:{port}", "127.0.0.1:0", 0),
        )
