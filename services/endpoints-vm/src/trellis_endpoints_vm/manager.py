"""endpoints-vm's state: the registry, its durable store, and ordered change events.

Every mutation (a registration, a heartbeat that revives a workload, a deregistration, an
expiry, a reload of declarations) runs under one lock: the store is written first (so
nothing acknowledged is lost), then the registry computes which service views changed, and
each change is announced on the bus with the next revision and fanned out to watchers in
that order. A watcher therefore sees each change once, in revision order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace

from trellis_common.fanout import Broadcaster, Subscription
from trellis_endpoints_vm.domain.declarations import DeclaredEndpoint, DeclaredEntry
from trellis_endpoints_vm.domain.registry import Change, EndpointRegistry, UnknownWorkload
from trellis_endpoints_vm.domain.views import ServiceKey, ServiceView
from trellis_endpoints_vm.domain.workloads import Workload, validate
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.store import WorkloadStore

log = logging.getLogger(__name__)

Announce = Callable[[str, str], Awaitable[int]]  # (kind, "ns/service") -> revision
TOPIC = "endpoints"

__all__ = ["TOPIC", "EndpointsManager", "UnknownWorkload", "ViewChange"]


@dataclass(frozen=True, slots=True)
class ViewChange:
    revision: int
    key: ServiceKey
    view: ServiceView | None


class EndpointsManager:
    def __init__(
        self,
        store: WorkloadStore,
        announce: Announce,
        metrics: EndpointMetrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._announce = announce
        self._metrics = metrics
        self._clock = clock
        self.registry = EndpointRegistry()
        self.revision = 0
        self._lock = asyncio.Lock()
        self._watchers: Broadcaster[ViewChange] = Broadcaster(on_count=metrics.watchers.set)
        self.ready = asyncio.Event()
        self.bind_gauges()

    async def start(self, revision: int = 0) -> None:
        """Load the stored registrations (no events: watchers list on connect)."""
        now = self._clock()
        for workload in await self._store.load_all():
            self.registry.upsert(workload, now)
        self.revision = revision
        log.info(
            "endpoints.loaded workloads=%d services=%d",
            len(self.registry.workloads),
            len(self.registry.views),
        )
        self.ready.set()

    # -- registrations ------------------------------------------------------------------

    async def register(self, workload: Workload) -> Workload:
        validate(workload)
        async with self._lock:
            now = self._clock()
            previous = self.registry.workloads.get(workload.id)
            workload = replace(
                workload,
                registered_at=previous.registered_at if previous else now,
                last_heartbeat=now,
            )
            await self._store.put(workload)
            self._metrics.registrations.inc()
            await self._emit(self.registry.upsert(workload, now))
            log.info(
                "workload.registered workload=%s services=%s address=%s ttl=%s",
                workload.id,
                ",".join(workload.services),
                workload.address,
                workload.ttl,
            )
            return workload

    async def heartbeat(self, workload_id: str) -> Workload:
        async with self._lock:
            if workload_id not in self.registry.workloads:
                raise UnknownWorkload(workload_id)
            beaten = self.registry.workloads[workload_id].beat(self._clock())
            await self._store.put(beaten)
            _, changes = self.registry.heartbeat(workload_id, beaten.last_heartbeat)
            if changes:
                log.info("workload.revived workload=%s", workload_id)
            await self._emit(changes)
            return beaten

    async def deregister(self, workload_id: str) -> None:
        async with self._lock:
            if workload_id not in self.registry.workloads:
                raise UnknownWorkload(workload_id)
            await self._store.delete(workload_id)
            await self._emit(self.registry.remove(workload_id, self._clock()))
            log.info("workload.deregistered workload=%s", workload_id)

    def workloads(self) -> list[tuple[Workload, bool]]:
        now = self._clock()
        return [(w, w.alive(now)) for _, w in sorted(self.registry.workloads.items())]

    # -- declarations -------------------------------------------------------------------

    async def declare(
        self, entries: Iterable[DeclaredEntry], workload_entries: Iterable[DeclaredEndpoint]
    ) -> list[str]:
        """Replace the declared ServiceEntries/WorkloadEntries; returns host conflicts."""
        async with self._lock:
            await self._emit(self.registry.declare(entries, workload_entries, self._clock()))
            for conflict in self.registry.conflicts:
                log.warning("declarations.conflict detail=%r", conflict)
            return list(self.registry.conflicts)

    # -- expiry ------------------------------------------------------------------------

    async def expire_once(self) -> int:
        async with self._lock:
            changes, expired = self.registry.expire(self._clock())
            for workload_id in expired:
                log.warning("workload.expired workload=%s reason=no-heartbeat", workload_id)
            self._metrics.expirations.inc(len(expired))
            await self._emit(changes)
            return len(changes)

    async def run_expiry(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        while not stop.is_set():
            try:
                await self.expire_once()
            except Exception:
                log.exception("expiry.failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)

    # -- views and watchers --------------------------------------------------------------

    def views(self, namespace: str = "") -> list[ServiceView]:
        return [
            v
            for k, v in sorted(self.registry.views.items())
            if not namespace or k.namespace == namespace
        ]

    def view(self, key: ServiceKey) -> ServiceView | None:
        return self.registry.views.get(key)

    def watch(self) -> Subscription[ViewChange]:
        return self._watchers.subscribe()

    async def _emit(self, changes: list[Change]) -> None:
        for change in changes:
            kind = "removed" if change.view is None else "changed"
            try:
                self.revision = await self._announce(kind, str(change.key))
            except Exception as exc:  # noqa: BLE001 (the bus is a bell; watchers still get it)
                log.warning("endpoints.announce_failed service=%s error=%r", change.key, exc)
                self.revision += 1
            self._metrics.changes.inc()
            self._watchers.publish(ViewChange(self.revision, change.key, change.view))

    def bind_gauges(self) -> None:
        """Gauges computed when scraped, so changes pay nothing for them."""

        def alive() -> int:
            now = self._clock()
            return sum(1 for w in self.registry.workloads.values() if w.alive(now))

        self._metrics.workloads.labels("alive").set_function(alive)
        self._metrics.workloads.labels("expired").set_function(
            lambda: len(self.registry.workloads) - alive()
        )
        self._metrics.services.set_function(lambda: len(self.registry.views))
        self._metrics.endpoints.set_function(
            lambda: sum(len(v.endpoints) for v in self.registry.views.values())
        )
