"""A lean REST client for the churn load: HTTP/1.1 on kept-alive TLS connections, no more.

The churn (:class:`bench.soak.Churn`) shares the machine with the control plane it loads:
on the 2-core development machine every millisecond of CPU the load generator spends per
change is a millisecond the measured services wait for a core. httpx spent about 3.5 ms
of CPU per call (its connection pool, ``httpcore``, ``h11`` and ``anyio`` layers in
Python); this client writes one request per connection at a time and reads the answer by
its ``Content-Length``, which is all endpoints-vm's API needs (uvicorn answers every call
with a length, or 204 without a body). It speaks the same HTTP and TLS as any client:
the server sees no difference.

Only the load uses it. What is timed (the observer's calls in :mod:`bench.propagation`,
the soak's probe) keeps a general client, httpx, as an agent would have one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class RestError(RuntimeError):
    """The connection failed, or the answer was not HTTP/1.1 as this client reads it."""


@dataclass(frozen=True)
class Request:
    method: str
    url: str


@dataclass(frozen=True)
class Response:
    """What :func:`bench.load.expect_status` reads of an httpx response."""

    request: Request
    status_code: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")


_Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class LeanClient:
    """``post``/``delete`` against ``base_url`` with httpx's arguments of
    :func:`bench.fullmesh.endpoints_vm` (``verify``: an SSL context; ``headers``)."""

    def __init__(
        self,
        base_url: str,
        verify: ssl.SSLContext,
        headers: dict[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "https" or parts.hostname is None or parts.port is None:
            raise ValueError(f"{base_url}: an https URL with a port is needed")
        self._base_url = base_url.rstrip("/")
        self._host, self._port = parts.hostname, parts.port
        self._ssl = verify
        self._timeout = timeout
        fixed = {"Host": f"{self._host}:{self._port}", **(headers or {})}
        self._fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed.items())
        self._idle: list[_Connection] = []

    async def post(self, path: str, json: Any) -> Response:
        return await self.request("POST", path, _dumps(json))

    async def delete(self, path: str) -> Response:
        return await self.request("DELETE", path, b"")

    async def request(self, method: str, path: str, body: bytes) -> Response:
        head = f"{method} {path} HTTP/1.1\r\n{self._fixed}Content-Length: {len(body)}\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        connection = self._idle.pop() if self._idle else await self._connect()
        try:
            async with asyncio.timeout(self._timeout):
                status, content, keep = await _exchange(connection, head.encode() + b"\r\n" + body)
        except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, ValueError) as exc:
            connection[1].close()
            raise RestError(f"{method} {self._base_url}{path}: {exc!r}") from exc
        if keep:
            self._idle.append(connection)
        else:
            connection[1].close()
        return Response(Request(method, f"{self._base_url}{path}"), status, content)

    async def _connect(self) -> _Connection:
        return await asyncio.open_connection(
            self._host, self._port, ssl=self._ssl, server_hostname=self._host
        )

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()
        for _, writer in idle:
            with contextlib.suppress(OSError, ssl.SSLError):  # the server may have gone first
                await writer.wait_closed()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def _exchange(connection: _Connection, request: bytes) -> tuple[int, bytes, bool]:
    """Write ``request``, read one answer: (status, body, whether to keep the connection)."""
    reader, writer = connection
    writer.write(request)
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    status_line, *fields = head[:-4].split("\r\n")
    version, code = status_line.split(" ", 2)[:2]
    headers = {}
    for line in fields:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", ""):
        raise ValueError("a chunked answer: this client reads answers by their length")
    status = int(code)
    length = int(headers.get("content-length", "0"))
    content = await reader.readexactly(length) if length else b""
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    return status, content, keep
