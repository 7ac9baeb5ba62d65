"""proxy-cp's copy of the catalog's destinations, for the Linkerd Destination API.

:class:`DestinationFollower` follows the ``views`` topic like the view follower: on each
signal (and on every resync) it asks ``ListDestinations(since=<our cursor>)`` what moved and
applies it to :class:`DestinationTable`. A ``full`` answer (the first, or a restarted
catalog) replaces the table: a destination missing from it is gone. The cursor moves only
once the answer is applied, so a failed call (the hub retries with backoff) misses nothing.
Listings are made one at a time; :meth:`DestinationFollower.fresh` asks for one on demand
(the Destination server, before it trusts a view newer than the table).

The table indexes destinations by ``namespace/name``, by ServiceEntry host and by address
(a Service's clusterIP), and tells the streams watching a destination that it moved:
each watcher is a callable that must not block (a stream puts a tick on its bounded queue).
Watchers of IP addresses hear every change, since any destination may gain or lose an
endpoint at that address.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_common.events import Follower
from trellis_common.locate import Locator
from trellis_common.signaling import Event
from trellis_proxy_cp.clients import owners

log = logging.getLogger(__name__)

TOPIC = "views"
EVERYTHING = "*"

Watcher = Callable[[], None]


class DestinationTable:
    def __init__(self) -> None:
        self.by_name: dict[str, pb.Destination] = {}
        self._by_host: dict[str, str] = {}
        self._by_address: dict[str, str] = {}
        self._watchers: dict[str, set[Watcher]] = {}
        self.changes = 0  # applied listings that moved something

    # -- lookups -------------------------------------------------------------------------

    def get(self, name: str) -> pb.Destination | None:
        return self.by_name.get(name)

    def by_host(self, host: str) -> pb.Destination | None:
        name = self._by_host.get(host)
        return self.by_name.get(name) if name else None

    def by_address(self, ip: str) -> pb.Destination | None:
        name = self._by_address.get(ip)
        return self.by_name.get(name) if name else None

    def destinations(self) -> Iterable[pb.Destination]:
        return self.by_name.values()

    # -- watchers ------------------------------------------------------------------------

    def watch(self, key: str, watcher: Watcher) -> Callable[[], None]:
        """Call ``watcher`` whenever destination ``key`` (or, for :data:`EVERYTHING`, any)
        moves; returns the function that stops it."""
        self._watchers.setdefault(key, set()).add(watcher)

        def stop() -> None:
            watchers = self._watchers.get(key)
            if watchers is not None:
                watchers.discard(watcher)
                if not watchers:
                    del self._watchers[key]

        return stop

    @property
    def watching(self) -> int:
        return sum(len(w) for w in self._watchers.values())

    # -- updates -------------------------------------------------------------------------

    def apply(
        self, changed: Iterable[pb.Destination], removed: Iterable[str], full: bool = False
    ) -> set[str]:
        """Apply a listing; returns the names that moved, whose watchers were told."""
        moved: set[str] = set()
        incoming = {f"{d.namespace}/{d.name}": d for d in changed}
        gone = set(removed)
        if full:
            gone |= set(self.by_name) - set(incoming)
        for name in gone:
            if self.by_name.pop(name, None) is not None:
                moved.add(name)
        for name, destination in incoming.items():
            old = self.by_name.get(name)
            if old is None or old.version != destination.version or old != destination:
                self.by_name[name] = destination
                moved.add(name)
        if moved:
            self.changes += 1
            self._reindex()
            self._tell(moved)
        return moved

    def _reindex(self) -> None:
        hosts: dict[str, str] = {}
        addresses: dict[str, str] = {}
        for name, destination in sorted(self.by_name.items()):
            for host in destination.hosts:
                hosts.setdefault(host.lower(), name)
            for address in destination.addresses:
                addresses.setdefault(address, name)
        self._by_host, self._by_address = hosts, addresses

    def _tell(self, moved: set[str]) -> None:
        told: set[Watcher] = set()
        for key in [*sorted(moved), EVERYTHING]:
            for watcher in list(self._watchers.get(key, ())):
                if watcher not in told:
                    told.add(watcher)
                    watcher()


class DestinationFollower(Follower):
    """The ``views`` topic, for destinations: list what moved since our cursor."""

    topics = (TOPIC,)

    def __init__(self, locator: Locator, table: DestinationTable) -> None:
        super().__init__("catalog destinations")
        self.locator = locator
        self.table = table
        self.cursor = ""
        self._listing = asyncio.Lock()  # one listing at a time: the cursor moves in order
        self._started = 0  # listings asked for so far
        self._applied = 0  # the number of the last one applied

    async def resync(self, topic: str) -> None:
        await self.sync()

    async def changed(self, event: Event) -> None:
        await self.sync()

    async def sync(self) -> None:
        async with self._listing:
            await self._list()

    async def fresh(self) -> None:
        """Return once the table holds a listing that was asked for after this call, so it
        is at least as new as anything the catalog answered before the call (a view, say).
        One listing serves every call made while the one before it was in flight. Raises
        what the call raises if the catalog cannot be asked."""
        asked_after = self._started
        async with self._listing:
            if self._applied > asked_after:
                return
            await self._list()

    async def _list(self) -> None:
        self._started += 1
        number = self._started
        request = pb.ListDestinationsRequest(since=self.cursor)
        listed: pb.ListDestinationsResponse = await owners.call(
            self.locator,
            lambda channel: pb_grpc.CatalogStub(channel).ListDestinations(request, timeout=30),
        )
        moved = self.table.apply(listed.destinations, listed.removed, full=listed.full)
        if moved:
            log.debug("destinations.moved count=%d full=%s", len(moved), listed.full)
        self.cursor = listed.cursor
        self._applied = number
