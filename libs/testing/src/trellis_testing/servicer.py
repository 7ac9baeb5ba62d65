"""A stand-in for ``grpc.aio.ServicerContext``: call a servicer's method without a server.

Fuzzing a servicer through a real server and channel costs milliseconds per request;
calling ``await servicer.Rpc(request, context)`` with this context costs microseconds and
shows the same outcome: :meth:`FakeServicerContext.abort` raises :class:`Aborted` with the
status code and details a client would get, as grpc.aio's own ``abort`` raises to end the
call. The real server is still what the servicers' unit tests use: :func:`served` runs one
on a free local port and hands out a channel to it.

:func:`check_names_a_field` is the fuzz suites' one property of a request check: it accepts,
or it refuses naming a field of the request and why; :func:`answers_or_refuses` is the same
property of a whole RPC, as every service's servicer fuzz test states it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn

import grpc
import pytest
from google.protobuf.message import Message

from trellis_runtime.grpcrequests import InvalidField
from trellis_runtime.grpcserver import GrpcServer, Registration
from trellis_runtime.health import Rejections


class Aborted(Exception):
    """The servicer ended the call with ``code`` and ``details``."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class FakeServicerContext:
    """Records how a call ended; only what Trellis' servicers use is there."""

    def __init__(self, peer: str = "ipv4:127.0.0.1:50000") -> None:
        self._peer = peer
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()
    ) -> NoReturn:
        self.code, self.details = code, details
        raise Aborted(code, details)

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        """A caller that presented no certificate: no identity."""
        return {}


async def invoke(
    method: Callable[[Any, Any], Awaitable[Any]], request: Any
) -> tuple[Any, Aborted | None]:
    """``await method(request, context)``: ``(answer, None)``, or ``(None, how it ended)``."""
    try:
        return await method(request, FakeServicerContext()), None
    except Aborted as aborted:
        return None, aborted


#: Per RPC: its request type, the service's check of that request, and the request's fields.
Checks = Mapping[str, tuple[type[Message], Callable[[Any], object], set[str]]]


def refused_field(checks: Checks, rpc: str, message: str) -> str:
    """The field a refusal of ``rpc`` names (``"<field>: <reason>"``); it must be one of
    the request's fields."""
    field = message.partition(": ")[0]
    assert field in checks[rpc][2], f"{rpc} refused {message!r}: not a field of its request"
    return field


def check_names_a_field(checks: Checks, rpc: str, request: Message) -> None:
    """Run ``rpc``'s check on ``request``: it accepts, or refuses naming a field and why."""
    try:
        checks[rpc][1](request)
        return
    except InvalidField as exc:
        error = exc
    assert refused_field(checks, rpc, str(error)) == error.field
    assert error.reason


async def answers_or_refuses(
    servicer: object,
    rpc: str,
    request: Message,
    rejections: Rejections,
    checks: Checks,
    *,
    not_a_check: tuple[str, ...] = (),
) -> Aborted | None:
    """Call ``rpc``: it answers a message and records no rejection, or ends NOT_FOUND, or
    refuses with INVALID_ARGUMENT naming a field of its request, recorded as a rejection.

    ``not_a_check`` lists the starts of refusals the domain makes rather than a request
    check (they need not name a field). Returns how the call ended, for ``event``.
    """
    before = len(rejections.items())
    answer, aborted = await invoke(getattr(servicer, rpc), request)
    if aborted is None:
        assert isinstance(answer, Message)
        assert len(rejections.items()) == before
        return None
    assert aborted.code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    if aborted.code == grpc.StatusCode.INVALID_ARGUMENT:
        assert (rpc, aborted.details) in [(r.key, r.reason) for r in rejections.items()]
        if not aborted.details.startswith(not_a_check):
            refused_field(checks, rpc, aborted.details)
    return aborted


@contextlib.asynccontextmanager
async def served(registration: Registration, service_name: str) -> AsyncIterator[grpc.aio.Channel]:
    """A :class:`GrpcServer` on a free local port serving one servicer, and a channel to it;
    the server drains and stops when the block ends."""
    server = GrpcServer("127.0.0.1:0", [registration], [service_name], grace=0.1)
    stop = asyncio.Event()
    await server.start()
    task = asyncio.create_task(server.run(stop))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield channel
    finally:
        stop.set()
        await task


async def refused_on_the_wire(
    call: Awaitable[object], rpc: str, message: str, rejections: Rejections
) -> str:
    """``call`` (an RPC through a real channel) fails INVALID_ARGUMENT with details starting
    with ``message``, recorded as the only rejection; returns the details."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert details.startswith(message)
    assert [(r.source, r.key, r.reason) for r in rejections.items()] == [("grpc", rpc, details)]
    return details
