"""A pod's ``portforward`` subresource for the test API server, which kmock does not serve
(nor ``GET /version/``, what the client's ``VersionApi`` asks: answered here too).

``kubectl port-forward`` and the ``kubernetes`` client's ``stream.portforward`` reach a
pod's port through the API server: ``GET /api/v1/namespaces/<ns>/pods/<pod>/portforward
?ports=P1,P2`` upgraded to a websocket of the ``v4.channel.k8s.io`` protocol. Each port of
the list, at index ``i``, has two channels: data on ``2i`` (both ways) and errors on
``2i+1`` (server to client). Every binary message starts with its channel's byte; the
first message on each channel is the port number in two bytes, little-endian (the client
checks it: ``kubernetes/stream/ws_client.py``), and after that come the bytes of the TCP
stream. The kubelet dials the pod's port when the stream opens; a failure is written to
the error channel, and the client closes that port. When every port's connection has
ended, the websocket is closed; when the client closes it, the connections are closed.

Pods here are not containers: a test's "pod" is a process on 127.0.0.1 with a free port
(the chart's processes share one address), so where a pod's port really listens is the
test's to say: :func:`forward` maps ``(namespace, pod, port)`` to ``(host, port)``. The pod
must be stored and ``Running``, as the API server requires; a port with no mapping fails
as a port nothing listens on does.

:class:`~trellis_testing.kubeserver.ApiServer` sends every request through
:func:`serve` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from kmock._internal import rendering

PROTOCOL = "v4.channel.k8s.io"
_PATH = re.compile(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)/portforward")

#: (namespace, pod, port) -> (host, port) where that pod's port really listens.
Targets = dict[tuple[str, str, int], tuple[str, int]]


def targets(server: Any) -> Targets:
    """The test's map of ``server`` (made on first use, so that the server needs no field
    of its own for it)."""
    found: Targets | None = getattr(server, "_port_forward_targets", None)
    if found is None:
        found = {}
        server._port_forward_targets = found
    return found


def forward(server: Any, namespace: str, pod: str, port: int, to: tuple[str, int]) -> None:
    """Port ``port`` of ``namespace/pod`` is really ``to`` (host, port)."""
    targets(server)[(namespace, pod, port)] = to


#: ``/version``: every field the client's VersionInfo requires.
VERSION = {
    "major": "1",
    "minor": "31",
    "gitVersion": "v1.31.0-trellis-test",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2024-08-13T00:00:00Z",
    "goVersion": "go1.22.5",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def _status(code: int, reason: str, message: str) -> web.StreamResponse:
    """The API server's error body, as kmock's own errors are."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "status": "Failure"}
    body |= {"message": message, "reason": reason, "code": code}
    return web.json_response(body, status=code)


async def serve(
    server: Any,
    request: rendering.Request,
    otherwise: Callable[[Any, rendering.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """A port-forward request or ``/version`` served here; any other by ``otherwise``."""
    if request.url.path in ("/version", "/version/"):
        return web.json_response(VERSION)
    match = _PATH.fullmatch(request.url.path)
    if match is None or request.method.upper() != "GET":
        return await otherwise(server, request)
    namespace, name = match.groups()
    pod = server.store.get(("", "pods", namespace, name))
    if pod is None:
        return _status(404, "NotFound", f'pods "{name}" not found')
    phase = (pod.get("status") or {}).get("phase")
    if phase != "Running":
        return _status(
            400, "BadRequest", f"pod {name} is not running (phase {phase}): cannot port-forward"
        )
    try:
        ports = [int(p) for p in request.params.get("ports", "").split(",") if p]
    except ValueError:
        return _status(400, "BadRequest", f"ports {request.params.get('ports')!r}: not numbers")
    if not ports or any(not 0 < p < 65536 for p in ports):
        return _status(400, "BadRequest", "ports: one or more port numbers (1-65535) required")
    raw = request._raw_request  # kmock keeps aiohttp's request: the upgrade needs it
    assert raw is not None
    socket = web.WebSocketResponse(protocols=(PROTOCOL,))
    await socket.prepare(raw)
    wanted = {p: targets(server).get((namespace, name, p)) for p in ports}
    await _relay(socket, namespace, name, ports, wanted)
    return socket


async def _relay(
    socket: web.WebSocketResponse,
    namespace: str,
    pod: str,
    ports: list[int],
    wanted: dict[int, tuple[str, int] | None],
) -> None:
    """The websocket's channels to and from one TCP connection per port."""
    writers: dict[int, asyncio.StreamWriter] = {}
    pumps: list[asyncio.Task[None]] = []
    for index, port in enumerate(ports):
        for channel in (2 * index, 2 * index + 1):
            await socket.send_bytes(bytes((channel,)) + port.to_bytes(2, "little"))
        try:
            target = wanted[port]
            if target is None:
                raise ConnectionRefusedError(f"no test target for {namespace}/{pod}:{port}")
            reader, writer = await asyncio.open_connection(*target)
        except OSError as exc:
            message = f"error forwarding port {port} to pod {namespace}/{pod}: {exc}"
            await socket.send_bytes(bytes((2 * index + 1,)) + message.encode())
            continue
        writers[index] = writer
        pumps.append(asyncio.create_task(_to_client(socket, reader, 2 * index)))
    if not pumps:
        await socket.close()
        return
    inbound = asyncio.create_task(_to_pods(socket, writers))
    pending: set[asyncio.Task[None]] = {inbound, *pumps}
    try:  # until the client closes, or every port's connection has ended
        while inbound in pending and len(pending) > 1:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for writer in writers.values():
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        await socket.close()


async def _to_client(
    socket: web.WebSocketResponse, reader: asyncio.StreamReader, channel: int
) -> None:
    """What the pod's port sends, on its data channel, until the pod closes it."""
    prefix = bytes((channel,))
    with contextlib.suppress(OSError):  # either end gone: the relay ends
        while chunk := await reader.read(65536):
            await socket.send_bytes(prefix + chunk)


async def _to_pods(socket: web.WebSocketResponse, writers: dict[int, asyncio.StreamWriter]) -> None:
    """What the client sends on a data channel, to that port's connection, until it closes
    the websocket."""
    with contextlib.suppress(OSError):
        await _each_message(socket, writers)


async def _each_message(
    socket: web.WebSocketResponse, writers: dict[int, asyncio.StreamWriter]
) -> None:
    async for message in socket:
        if message.type != aiohttp.WSMsgType.BINARY or not message.data:
            continue
        channel, data = message.data[0], message.data[1:]
        writer = writers.get(channel // 2)
        if channel % 2 == 0 and writer is not None and data:
            writer.write(data)
            await writer.drain()
