"""endpoints-vm's state: the registry, its durable store, and ordered change events.

Every mutation (a registration, a heartbeat that revives a workload, a deregistration, an
expiry, a reload of declarations) runs under one lock: the registry computes which service
views changed, and each change is announced on the bus with the next revision and fanned
out to watchers in that order. A watcher therefore sees each change once, in revision order.

Redis outages (writes go through a :class:`~trellis_endpoints_vm.keeper.StoreKeeper`):

* **Registrations and deregistrations are durable or refused.** The store is written first
  (so nothing acknowledged is lost); when Redis does not take the write within the store
  timeout, or is known to be unavailable, the call fails with :class:`StoreUnavailable`
  (HTTP 503 naming Redis) and memory is left as it was. We chose this over accepting them
  in memory: an acknowledged registration that a crash during the outage would lose is a
  lie to the workload, while a refused one is simply retried by its agent.
* **Heartbeats always count.** A heartbeat is applied in memory first, then persisted; if
  Redis is unavailable the write is queued and flushed when it returns. Every workload that
  was alive when the store became unavailable, and every one whose heartbeat is queued, is
  *held* alive until Redis is back and then for one more TTL: no workload expires because
  the control plane could not write.
* **Reads never touch Redis**: views and listings come from memory, the last known state.
* While the store is unavailable the bus (the same Redis) is not rung; watchers still get
  every change, and bus subscribers resync when they reconnect. Revisions never go back.

Records that fail validation at load are skipped, and reported through ``rejections``
(source ``redis``) until the workload registers again or is deregistered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace

from trellis_common.fanout import Broadcaster, Subscription
from trellis_common.health import Rejections
from trellis_endpoints_vm.domain.declarations import DeclaredEndpoint, DeclaredEntry
from trellis_endpoints_vm.domain.registry import Change, EndpointRegistry, UnknownWorkload
from trellis_endpoints_vm.domain.views import ServiceKey, ServiceView
from trellis_endpoints_vm.domain.workloads import Workload, validate
from trellis_endpoints_vm.keeper import StoreKeeper, StoreUnavailable
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.store import Rejected, WorkloadStore

log = logging.getLogger(__name__)

Announce = Callable[[str, str], Awaitable[int]]  # (kind, "ns/service") -> revision
TOPIC = "endpoints"
REJECTION_SOURCE = "redis"

__all__ = ["TOPIC", "EndpointsManager", "StoreUnavailable", "UnknownWorkload", "ViewChange"]


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
        *,
        rejections: Rejections | None = None,
        store_timeout: float = 2.0,
        store_check_interval: float = 5.0,
    ) -> None:
        self._store = store
        self._announce = announce
        self._metrics = metrics
        self._clock = clock
        self._rejections = rejections
        self._rejected: dict[str, str] = {}  # stored field -> where it lives, while refused
        self._announce_timeout = store_timeout
        self._announce_failing = False
        self.registry = EndpointRegistry()
        self.keeper = StoreKeeper(
            store,
            self.registry.workloads.get,
            self.registry.workloads.keys,
            timeout=store_timeout,
            check_interval=store_check_interval,
            extra=lambda: len(self._rejected),
            on_unavailable=self._hold,
            on_recovered=self._release,
        )
        self.revision = 0
        self._lock = asyncio.Lock()
        self._watchers: Broadcaster[ViewChange] = Broadcaster(on_count=metrics.watchers.set)
        self.ready = asyncio.Event()
        self.bind_gauges()

    async def start(self, revision: int = 0) -> None:
        """Load the stored registrations (no events: watchers list on connect)."""
        now = self._clock()
        loaded = await self._store.load_all()
        for workload in loaded.workloads:
            self.registry.upsert(workload, now)
        for rejected in loaded.rejected:
            self._reject(rejected)
        self.revision = revision
        log.info(
            "endpoints.loaded workloads=%d services=%d rejected=%d",
            len(self.registry.workloads),
            len(self.registry.views),
            len(loaded.rejected),
        )
        self.ready.set()

    def _reject(self, rejected: Rejected) -> None:
        self._rejected[rejected.field] = rejected.key
        if self._rejections is not None:
            self._rejections.reject(REJECTION_SOURCE, rejected.key, rejected.reason)

    def _overwritten(self, workload_id: str) -> None:
        """A refused record was overwritten or deleted: it is no longer rejected."""
        key = self._rejected.pop(workload_id, None)
        if key is not None and self._rejections is not None:
            self._rejections.accept(REJECTION_SOURCE, key)

    def rejected(self) -> list[str]:
        """The ids of stored records that were refused at load and are still there."""
        return sorted(self._rejected)

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
            await self._durably("register", workload.id, self.keeper.put(workload))
            self._overwritten(workload.id)
            self._metrics.registrations.inc()
            await self._emit(self.registry.upsert(workload, now))
            log.debug(
                "workload.registered workload=%s services=%s address=%s ttl=%s",
                workload.id,
                ",".join(workload.services),
                workload.address,
                workload.ttl,
            )
            return workload

    async def heartbeat(self, workload_id: str) -> Workload:
        """Count a heartbeat in memory, then persist it (queued while Redis is away)."""
        async with self._lock:
            now = self._clock()
            beaten, changes = self.registry.heartbeat(workload_id, now)
            if not await self.keeper.persist(workload_id):
                self.registry.hold(now, [workload_id])
            if changes:
                log.debug("workload.revived workload=%s", workload_id)
            await self._emit(changes)
            return beaten

    async def deregister(self, workload_id: str) -> None:
        """Delete a registration (or a refused record still stored under that id)."""
        async with self._lock:
            if workload_id not in self.registry.workloads:
                if workload_id not in self._rejected:
                    raise UnknownWorkload(workload_id)
                await self._durably("deregister", workload_id, self.keeper.delete(workload_id))
                log.info("store.rejected_record_deleted workload=%s", workload_id)
                self._overwritten(workload_id)
                return
            await self._durably("deregister", workload_id, self.keeper.delete(workload_id))
            self._overwritten(workload_id)
            await self._emit(self.registry.remove(workload_id, self._clock()))
            log.debug("workload.deregistered workload=%s", workload_id)

    def workloads(self) -> list[tuple[Workload, bool]]:
        now = self._clock()
        return [
            (w, self.registry.is_alive(w, now)) for _, w in sorted(self.registry.workloads.items())
        ]

    # -- the store's outages -------------------------------------------------------------

    async def _durably(self, operation: str, workload_id: str, write: Awaitable[None]) -> None:
        """Await a store write; a refusal (StoreUnavailable) is counted, logged and raised."""
        try:
            await write
        except StoreUnavailable:
            self._metrics.store_refusals.labels(operation).inc()
            log.debug(
                "workload.refused operation=%s workload=%s reason=store-unavailable",
                operation,
                workload_id,
            )
            raise

    def _hold(self) -> None:
        held = self.registry.hold(self._clock())
        log.warning("workloads.held count=%d reason=store-unavailable", held)

    def _release(self) -> None:
        released = self.registry.release(self._clock())
        log.info("workloads.grace count=%d reason=store-recovered until=one-ttl", released)

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
            revision = self.revision + 1
            if self.keeper.available:  # the bus is the same Redis: no waiting on it when down
                try:
                    async with asyncio.timeout(self._announce_timeout):
                        revision = max(revision, await self._announce(kind, str(change.key)))
                except Exception as exc:  # noqa: BLE001 (the bus is a bell; watchers still get it)
                    level = logging.DEBUG if self._announce_failing else logging.WARNING
                    log.log(level, "endpoints.announce_failed service=%s error=%r", change.key, exc)
                    self._announce_failing = True
                else:
                    if self._announce_failing:
                        log.info("endpoints.announce_recovered service=%s", change.key)
                    self._announce_failing = False
            self.revision = revision
            self._metrics.changes.inc()
            self._watchers.publish(ViewChange(self.revision, change.key, change.view))

    def bind_gauges(self) -> None:
        """Gauges computed when scraped, so changes pay nothing for them."""

        def alive() -> int:
            now = self._clock()
            return sum(
                1 for w in self.registry.workloads.values() if self.registry.is_alive(w, now)
            )

        self._metrics.workloads.labels("alive").set_function(alive)
        self._metrics.workloads.labels("expired").set_function(
            lambda: len(self.registry.workloads) - alive()
        )
        self._metrics.services.set_function(lambda: len(self.registry.views))
        self._metrics.endpoints.set_function(
            lambda: sum(len(v.endpoints) for v in self.registry.views.values())
        )
        self._metrics.store_pending.set_function(lambda: len(self.keeper.pending))
        self._metrics.store_available.set_function(lambda: 1 if self.keeper.available else 0)
