"""What changed, for each watcher of a stream: keys, coalesced, never lost.

An owner that serves a watch (an endpoints provider's ``WatchServices``) tells its
:class:`ChangeFeed` the keys it changed, at the moment it changes them in memory. Each
watcher (one open stream) holds the keys changed since it last took them, in the order
they first changed; :meth:`Watch.next` waits for at least one and takes them all. The
stream then reads each key's state *now* and sends it, so a key that changed five times
while the previous answer was being written is sent once, as it is, and nothing is missed:

* a watcher is registered before the stream's first (full) answer is read, so a change
  made while that answer is built is in both;
* what a watcher holds is bounded by the number of keys, not by the rate of changes, so a
  slow stream costs memory for what it has not sent, never for the history.

It is all in memory and in one event loop: :meth:`ChangeFeed.changed` is synchronous, so
an owner can call it while it holds its own lock, right where the change is made.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

__all__ = ["ChangeFeed", "Watch"]


class Watch(Generic[K]):
    """One watcher's keys changed and not yet taken."""

    __slots__ = ("_pending", "_ready")

    def __init__(self) -> None:
        self._pending: dict[K, None] = {}  # insertion-ordered: first change first
        self._ready = asyncio.Event()

    def add(self, keys: Iterable[K]) -> None:
        self._pending.update(dict.fromkeys(keys))
        if self._pending:
            self._ready.set()

    def take(self) -> list[K]:
        """Every key changed so far, without waiting (none: an empty list)."""
        taken, self._pending = list(self._pending), {}
        self._ready.clear()
        return taken

    async def next(self) -> list[K]:
        """Wait until some key changed, then take every key changed so far."""
        while not self._pending:
            self._ready.clear()
            await self._ready.wait()
        return self.take()


class ChangeFeed(Generic[K]):
    """The owner's side: one per watched collection."""

    def __init__(self) -> None:
        self._watches: set[Watch[K]] = set()

    def changed(self, keys: Iterable[K]) -> None:
        """``keys`` changed (or were removed) just now."""
        if self._watches:
            keys = list(keys)
            for watch in self._watches:
                watch.add(keys)

    @property
    def watchers(self) -> int:
        return len(self._watches)

    @contextmanager
    def watch(self) -> Iterator[Watch[K]]:
        """A watcher for the life of one stream; enter it before reading the full state."""
        watch: Watch[K] = Watch()
        self._watches.add(watch)
        try:
            yield watch
        finally:
            self._watches.discard(watch)
