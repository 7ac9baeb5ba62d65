"""proxy-cp's copy of the catalog's destinations, for the Linkerd Destination API.

The catalog publishes each service as a ``destination/<namespace>/<name>`` resource; the
catalog client's one follower (:class:`~.catalog.ResourceFollower`) fetches those whose
version moved and applies them to :class:`DestinationTable`, and drops those that are gone
(a full listing that lacks one, after a catalog restart, says it is gone).
:meth:`~.catalog.ResourceFollower.fresh` asks for a listing on demand (the Destination
server, before it trusts a policy newer than the table).

The table indexes destinations by ``namespace/name``, by ServiceEntry host and by address
(a Service's clusterIP), and tells the streams watching a destination that it moved:
each watcher is a callable that must not block (a stream puts a tick on its bounded queue).
Watchers of IP addresses hear every change, since any destination may gain or lose an
endpoint at that address.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from trellis_api import catalog_pb2 as pb

log = logging.getLogger(__name__)

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
