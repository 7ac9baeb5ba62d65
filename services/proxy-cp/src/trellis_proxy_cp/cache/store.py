"""The snapshot cache: the latest consistent snapshot per key, and wake-ups when one changes.

A key names a group of proxies that get the same configuration (in Trellis, one service
identity), so every proxy of the group shares one snapshot and its once-serialized resources.

The transports see the cache only through :class:`SnapshotSource` (``get``, ``subscribe``
and ``wait``), the
one small seam between cache and transport that go-control-plane's ``ConfigWatcher`` is.
Unlike go-control-plane, the cache keeps no per-type watches: each stream subscribes to its
key (:meth:`SnapshotCache.subscribe`) and is called back, soon after the key's snapshot is
replaced, from the event loop (one ``call_soon`` per stream: no task, no future, nothing
else held per stream); the stream then decides which types changed for it
(:meth:`Snapshot.version_of`). Setting a key therefore reaches exactly the streams of that
key, in O(streams of the key). :meth:`SnapshotCache.wait` parks a coroutine on a key
instead, for callers that want to await the next snapshot.

Single event loop only: the cache is not thread-safe and needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from trellis_proxy_cp.cache.snapshot import Snapshot

log = logging.getLogger(__name__)


class InconsistentSnapshot(ValueError):
    """A snapshot Envoy could not warm; the cache kept the previous one."""

    def __init__(self, key: str, problems: Sequence[str]) -> None:
        self.key = key
        self.problems = list(problems)
        super().__init__(f"inconsistent snapshot for {key!r}: " + "; ".join(self.problems))


class SnapshotSource(Protocol):
    """What the xDS transports need from the cache."""

    def get(self, key: str) -> Snapshot | None:
        """The current snapshot of ``key``, or ``None`` while there is none."""
        ...

    async def wait(self, key: str, seen: Snapshot | None) -> Snapshot:
        """Return the current snapshot of ``key`` as soon as there is one that is not ``seen``."""
        ...

    def subscribe(self, key: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` soon (from the event loop, never from within the setter)
        after every new snapshot of ``key``; returns the function that stops it."""
        ...


class SnapshotCache:
    """Latest snapshot per key; satisfies :class:`SnapshotSource`."""

    def __init__(self) -> None:
        self._snapshots: dict[str, Snapshot] = {}
        self._events: dict[str, asyncio.Event] = {}
        #: each key's streams in the order they subscribed (a dict as an ordered set): a
        #: change wakes the longest-connected first, the same order every time
        self._subscribers: dict[str, dict[Callable[[], None], None]] = {}

    def set_snapshot(self, key: str, snapshot: Snapshot, *, checked: bool = False) -> None:
        """Replace the key's snapshot and wake its streams; refuse an inconsistent one.
        ``checked``: it is consistent by construction (:meth:`Snapshot.with_type` of a
        snapshot this cache took), so it is not checked again."""
        problems = [] if checked else snapshot.consistent()
        if problems:
            log.warning(
                "cache.inconsistent key=%s version=%s problems=%r",
                key,
                snapshot.version,
                problems,
            )
            raise InconsistentSnapshot(key, problems)
        self._snapshots[key] = snapshot
        log.debug("cache.set key=%s version=%s", key, snapshot.version)
        self._notify(key)

    def get(self, key: str) -> Snapshot | None:
        return self._snapshots.get(key)

    def clear(self, key: str) -> None:
        """Forget the key. Its streams keep what they were sent and wait for a new snapshot."""
        self._snapshots.pop(key, None)

    def keys(self) -> list[str]:
        return sorted(self._snapshots)

    def waiting(self, key: str) -> bool:
        """Whether some stream is parked on ``key`` (for tests and the admin API)."""
        return key in self._events

    async def wait(self, key: str, seen: Snapshot | None) -> Snapshot:
        while True:
            current = self._snapshots.get(key)
            if current is not None and current is not seen:
                return current
            event = self._events.get(key)
            if event is None:
                event = self._events[key] = asyncio.Event()
            await event.wait()

    def subscribe(self, key: str, callback: Callable[[], None]) -> Callable[[], None]:
        self._subscribers.setdefault(key, {})[callback] = None

        def stop() -> None:
            subscribers = self._subscribers.get(key)
            if subscribers is not None:
                subscribers.pop(callback, None)
                if not subscribers:
                    del self._subscribers[key]

        return stop

    def subscribed(self, key: str) -> int:
        """How many streams follow ``key`` (for tests and the admin API)."""
        return len(self._subscribers.get(key, ()))

    def _notify(self, key: str) -> None:
        subscribers = self._subscribers.get(key)
        if subscribers:
            call_soon = asyncio.get_running_loop().call_soon
            for callback in subscribers:
                call_soon(callback)
        # Replace, then set: waiters of the old event wake, later waiters park on a fresh
        # one. A key nobody waits on keeps no event.
        event = self._events.pop(key, None)
        if event is not None:
            event.set()
