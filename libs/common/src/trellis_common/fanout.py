"""Fan-out of changes to watch streams, each with its own bounded queue.

As in Linkerd's destination service, a slow watcher is ended rather than allowed to hold
everyone back: when its queue is full it receives :class:`WatchOverflow` at its next read
and must list again and re-watch. Publishing never blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

DEFAULT_QUEUE = 1024


class WatchOverflow(Exception):
    """A watcher fell more than its queue behind; it must re-list and watch again."""


class Broadcaster(Generic[T]):
    def __init__(
        self, queue_size: int = DEFAULT_QUEUE, on_count: Callable[[int], None] | None = None
    ) -> None:
        self._queue_size = queue_size
        self._queues: set[asyncio.Queue[T | None]] = set()
        self._on_count = on_count

    def __len__(self) -> int:
        return len(self._queues)

    def publish(self, item: T) -> None:
        for queue in list(self._queues):
            try:
                queue.put_nowait(item)
            except asyncio.QueueFull:
                self._release(queue)
                # What it has not read is stale once it must re-list: drop it, so the very
                # next read ends the watcher.
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(None)

    def subscribe(self) -> Subscription[T]:
        """Items published from the moment of this call (not of the first read).

        Registering eagerly lets a caller read its snapshot revision *after* subscribing
        without missing what happens in between. ``aclose()`` (or ``async with``) releases it.
        """
        queue: asyncio.Queue[T | None] = asyncio.Queue(self._queue_size)
        self._queues.add(queue)
        self._count()
        return Subscription(self, queue)

    def _release(self, queue: asyncio.Queue[T | None]) -> None:
        if queue in self._queues:
            self._queues.discard(queue)
            self._count()

    def _count(self) -> None:
        if self._on_count is not None:
            self._on_count(len(self._queues))


class Subscription(Generic[T]):
    """One watcher's view of a :class:`Broadcaster`: an async iterator with ``aclose``."""

    def __init__(self, source: Broadcaster[T], queue: asyncio.Queue[T | None]) -> None:
        self._source = source
        self._queue = queue

    def __aiter__(self) -> Subscription[T]:
        return self

    async def __anext__(self) -> T:
        item = await self._queue.get()
        if item is None:
            self._source._release(self._queue)
            raise WatchOverflow(f"watcher fell {self._queue.maxsize} changes behind")
        return item

    async def aclose(self) -> None:
        self._source._release(self._queue)

    async def __aenter__(self) -> Subscription[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
