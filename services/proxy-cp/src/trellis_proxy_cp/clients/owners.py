"""One call to the service that owns some state, through its :class:`Locator`.

proxy-cp fetches from two owners (the catalog, certmanager) and finds each with a
:class:`~trellis_runtime.locate.Locator` (an address from the settings, else the service
registry). Every call goes the same way: a stub on the locator's channel, and on an RPC
error the locator is told (``UNAVAILABLE``: look the owner up again next time) before the
error goes on to the caller, which decides whether to retry or resync.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from trellis_runtime.locate import Locator

T = TypeVar("T")


async def call(locator: Locator, rpc: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
    """``rpc(channel)`` on the owner's channel; raises ``OwnerUnavailable`` or the RPC error."""
    channel = await locator.channel()
    try:
        return await rpc(channel)
    except grpc.aio.AioRpcError as exc:
        locator.failed(exc)
        raise
