"""A stream's write side: the bounded :class:`Outbox` of responses its machine queues, and
the :class:`Writer` that drains it into the gRPC stream (:mod:`.streams` runs both).

Both hold as little as they can per stream: thousands of streams are open at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import grpc

from trellis_proxy_cp.types import SHORT

if TYPE_CHECKING:  # annotations only: streams imports this module
    from trellis_proxy_cp.transport.streamhooks import StreamHooks
    from trellis_proxy_cp.transport.streams import Outgoing, ProxyStream

log = logging.getLogger("trellis_proxy_cp.transport.streams")  # the lines it always wrote

_Context = grpc.aio.ServicerContext[Any, Any]


class Outbox:
    """A stream's bounded queue of responses, with its one reader (the writer): a list and,
    while the writer waits, one future. (``asyncio.Queue`` keeps three deques and an event
    per queue: kilobytes, times thousands of streams. A deque costs 600 bytes empty, a list
    56; with one response in flight per type the queue holds a few at most, so taking
    from the front of a list costs nothing.)"""

    __slots__ = ("_items", "_size", "_waiter")

    def __init__(self, size: int) -> None:
        self._items: list[Outgoing] = []
        self._size = size
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Outgoing) -> bool:
        """Queue ``item``; False (nothing queued) when the outbox is full."""
        if len(self._items) >= self._size:
            return False
        self._items.append(item)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        return True

    async def get(self) -> Outgoing:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)

    def __len__(self) -> int:
        return len(self._items)


class Writer:
    """Drains a stream's outbox into the gRPC stream; :meth:`finish` ends it between two
    messages, never in the middle of one."""

    __slots__ = ("_context", "_hooks", "_outbox", "_stopping", "_stream", "_writing", "_written")

    def __init__(
        self,
        stream: ProxyStream,
        outbox: Outbox,
        context: _Context,
        hooks: StreamHooks,
    ) -> None:
        self._stream = stream
        self._outbox = outbox
        self._context = context
        self._hooks = hooks
        self._writing = False
        self._stopping = False
        self._written: asyncio.Future[None] | None = None  # made only when finish() waits

    async def run(self) -> None:
        stream = self._stream
        while not self._stopping:
            item = await self._outbox.get()
            self._writing = True
            await self._context.write(item.message)
            self._writing = False
            if self._written is not None and not self._written.done():
                self._written.set_result(None)
            log.debug(
                "ads.sent proxy=%s type=%s version=%s",
                stream.proxy_id,
                SHORT.get(item.type_url, item.type_url),
                item.version,
            )
            self._hooks.on_sent(stream, item.type_url, item.version)
            del item  # a response is kilobytes: not held while the stream idles

    async def finish(self, grace: float) -> None:
        """Write nothing more; wait (up to ``grace`` seconds) for the message being written."""
        self._stopping = True
        if self._writing:
            self._written = asyncio.get_running_loop().create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._written, grace)
