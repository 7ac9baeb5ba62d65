"""The HTTP+JSON floor of a registration: a bare FastAPI app in its own process.

``endpoints-vm`` answers ``POST /v1/workloads`` from its own process, on its own core; a
floor served from the benchmark's event loop (or through ``httpx.ASGITransport``) would
share the client's core and not be comparable. So :class:`HttpFloor` starts
``python -m bench.http_floor``, which serves one POST route that parses the service's own
:class:`~trellis_endpoints_vm.transport.rest.RegistrationBody` and returns it, under uvicorn
configured as :class:`trellis_runtime.admin.AdminServer` configures it (no access log, no
lifespan) but with ``TCP_NODELAY`` on (see :func:`serve`). No token guard, no store, no
bus: only routing, validation and JSON both ways.

The child binds 127.0.0.1:0 itself and prints the port as its first line of output.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from trellis_endpoints_vm.transport.rest import RegistrationBody
from trellis_runtime.admin import KEEP_ALIVE_SECONDS

ROOT = Path(__file__).resolve().parent.parent  # where ``python -m bench.http_floor`` works


def create_app() -> FastAPI:
    app = FastAPI(title="bench http floor")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/workloads", status_code=201)
    async def register(body: RegistrationBody) -> dict[str, Any]:
        return body.model_dump()

    return app


def serve() -> None:
    """The child: bind, print the port, serve until SIGTERM."""
    # IPPROTO_TCP, not the default 0: asyncio sets TCP_NODELAY only on sockets whose
    # ``proto`` says TCP, and accepted sockets inherit the listener's. With 0, h11's two
    # writes per response (head, then body) wait on the client's delayed ACK (~40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    # idle connections kept as Trellis' servers keep them (trellis_runtime.admin): with
    # uvicorn's 5 s, a connection idle between two rounds is closed as the client reuses it
    config = uvicorn.Config(
        create_app(),
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    uvicorn.Server(config).run(sockets=[sock])


class HttpFloor:
    """The child process, as a context manager; ``url`` once it answers."""

    def __init__(self, timeout: float = 30.0) -> None:
        self._timeout = timeout
        self._process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> HttpFloor:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.http_floor"],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.isdigit():
            raise RuntimeError(f"bench.http_floor did not start (first line {line!r})")
        self.url = f"http://127.0.0.1:{line}"
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"bench.http_floor at {self.url} never answered")
            time.sleep(0.05)

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        finally:
            if process.stdout is not None:
                process.stdout.close()


if __name__ == "__main__":
    serve()
