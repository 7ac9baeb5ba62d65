"""endpoints-vm's state: the registry, its durable store, and the changes it pushes.

Every mutation (a registration, a heartbeat that revives a workload, a deregistration, an
expiry, a reload of declarations) runs under one lock: the registry computes which service
views changed, the manager counts them in ``revision`` and tells its :attr:`feed` at once,
which pushes them on the catalog's watches (``WatchServices``: each service as it is when
the answer is written, so the catalog's last answer holds the last state;
``docs/architecture.md``, "How a change travels").

Redis outages (writes go through a :class:`~trellis_endpoints_vm.keeper.StoreKeeper`):

* **Registrations and deregistrations are durable or refused.** The store is written first
  (so nothing acknowledged is lost), for all the calls that arrived together in one write
  (:mod:`~trellis_endpoints_vm.commits`); when Redis does not take the write within the
  store timeout, or is known to be unavailable, those calls fail with
  :class:`StoreUnavailable` (HTTP 503 naming Redis) and memory is left as it was. We chose
  this over accepting them in memory: an acknowledged registration that a crash during the
  outage would lose is a lie to the workload, while a refused one is retried by its agent.
* **Heartbeats always count.** A heartbeat is applied in memory first, then persisted; if
  Redis is unavailable the write is queued and flushed when it returns. Every workload that
  was alive when the store became unavailable, and every one whose heartbeat is queued, is
  *held* alive until Redis is back and then for one more TTL: no workload expires because
  the control plane could not write.
* **Reads never touch Redis**: views and listings come from memory, the last known state.
* **The replicas' signals are kept, and never hold a caller long.** The service's
  :class:`~trellis_runtime.events.Outbox` keeps a signal Redis does not take and sends it
  when Redis is back. They leave in the background, in order (:mod:`.mirroring`).

Replicas (:mod:`trellis_endpoints_vm.replicas`): any replica takes registrations and
heartbeats. Each change a replica makes to its registry is also signalled on the
:data:`MIRROR` topic (key: the workload id; kinds ``changed``, ``expired``, ``revived``),
and the other replicas read that workload back from Redis (:meth:`EndpointsManager.mirror`)
or take the verdict (:meth:`EndpointsManager.verdict`), then push their own view changes
to the watches they serve, so that whichever replica the catalog watches answers the same
once the signals have passed.
Only the leader (``leading``) judges expiry, with the heartbeats other replicas stored
read back first: the TTL is judged once.

Records that fail validation at load are skipped, and reported through ``rejections``
(source ``redis``) until the workload registers again or is deregistered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from redis.exceptions import RedisError

from trellis_common.changefeed import ChangeFeed
from trellis_endpoints_vm.commits import GroupCommit
from trellis_endpoints_vm.domain.declarations import DeclaredEndpoint, DeclaredEntry
from trellis_endpoints_vm.domain.registry import Change, EndpointRegistry, UnknownWorkload
from trellis_endpoints_vm.domain.views import ServiceKey, ServiceView
from trellis_endpoints_vm.domain.workloads import Workload, validate
from trellis_endpoints_vm.keeper import StoreKeeper, StoreUnavailable
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.mirroring import Signal, Signals
from trellis_endpoints_vm.reaping import REAP_AFTER_SECONDS, Reaper
from trellis_endpoints_vm.store import WorkloadStore
from trellis_runtime import lifecycle
from trellis_runtime.health import Rejections
from trellis_runtime.stored import Refused

log = logging.getLogger(__name__)

#: A registration (workload id, the workload asked) or a deregistration (id, None).
Call = tuple[str, Workload | None]
CHANGED = "changed"
#: The replicas' topic: which workload changed (kinds CHANGED, EXPIRED, REVIVED).
MIRROR = "workloads"
EXPIRED = "expired"
REVIVED = "revived"
REJECTION_SOURCE = "redis"
#: How often the leader reads back the heartbeats of the workloads it counts dead: a
#: revival heard by another replica whose signal was lost reaches it from the store.
DEAD_RECHECK_SECONDS = 2.0

__all__ = ["MIRROR", "EndpointsManager", "StoreUnavailable", "UnknownWorkload"]


class EndpointsManager:
    def __init__(
        self,
        store: WorkloadStore,
        metrics: EndpointMetrics,
        clock: Callable[[], float] = time.time,
        *,
        rejections: Rejections | None = None,
        store_timeout: float = 2.0,
        store_check_interval: float = 5.0,
        notify: Signal | None = None,
        leading: Callable[[], bool] = lambda: True,
        alone: Callable[[], bool] = lambda: False,
        reap_after: float = REAP_AFTER_SECONDS,
    ) -> None:
        self._store = store
        self._signals = Signals(notify, store_timeout, alone, metrics.signals_skipped.inc)
        self._leading = leading
        self._metrics = metrics
        self._clock = clock
        self._rejected = Refused(rejections, REJECTION_SOURCE)  # by workload id
        self._signal_timeout = store_timeout
        self.registry = EndpointRegistry()
        self._judgement_held = False  # expiry postponed: the store could not say who beat
        self._led: bool | None = None  # whether the last expiry sweep led (None: none yet)
        self._dead_read_at = 0.0  # when the heartbeats of the dead are read back next
        self.keeper = StoreKeeper(
            store,
            self.registry.workloads.get,
            self.registry.workloads.keys,
            timeout=store_timeout,
            check_interval=store_check_interval,
            extra=lambda: len(self._rejected),
            on_unavailable=self._hold,
            on_recovered=self._release,
            refills=leading,
        )
        #: Service views changed since this process started (for listings, status and the
        #: watch answers' ``revision``).
        self.revision = 0
        #: The services changed, for the catalog's watches (``WatchServices``).
        self.feed: ChangeFeed[ServiceKey] = ChangeFeed()
        self._lock = asyncio.Lock()
        #: registrations and deregistrations, committed in groups (one store write each)
        self.commits: GroupCommit[Call, Workload | None] = GroupCommit(self._commit)
        self.ready = asyncio.Event()
        #: deregisters the workloads expired for ``reap_after`` (:mod:`.reaping`)
        self.reaper = Reaper(self.registry, self.keeper, self._count, metrics.reaped, reap_after)
        metrics.bind(self.registry, self.keeper, clock)

    async def start(self) -> None:
        """Load the stored registrations (nothing pushed: a watch starts with every
        service)."""
        now = self._clock()
        loaded = await self._store.load_all()
        for workload in loaded.records:
            self.registry.upsert(workload, now)
        for rejected in loaded.rejected:
            self._rejected.add(rejected)
        granted, _ = self.registry.restarted(now)  # no watch yet: each starts in full
        log.info(
            "endpoints.loaded workloads=%d services=%d rejected=%d grace=%d until=one-ttl",
            len(self.registry.workloads),
            len(self.registry.views),
            len(loaded.rejected),
            granted,
        )
        self.ready.set()

    def rejected(self) -> list[str]:
        """The ids of stored records that were refused at load and are still there."""
        return self._rejected.fields()

    # -- registrations ------------------------------------------------------------------

    async def register(self, workload: Workload) -> Workload:
        """Store, then serve, a registration (committed with those that arrive with it:
        :mod:`~trellis_endpoints_vm.commits`); its record as stored."""
        validate(workload)
        registered = await self.commits.submit((workload.id, workload))
        assert registered is not None  # a registration's result is its record
        return registered

    async def heartbeat(self, workload_id: str) -> Workload:
        """Count a heartbeat in memory, then persist it (queued while Redis is away)."""
        async with self._lock:
            now = self._clock()
            beaten, changes = self.registry.heartbeat(workload_id, now)
            if not await self.keeper.persist(workload_id):
                self.registry.hold(now, [workload_id])
            if changes:
                log.debug("workload.revived workload=%s", workload_id)
            self._count(changes)
        await self._send([(REVIVED, workload_id)] if changes else [])
        return beaten

    async def deregister(self, workload_id: str) -> None:
        """Delete a registration (or a refused record still stored under that id)."""
        await self.commits.submit((workload_id, None))

    async def _commit(self, calls: Sequence[Call]) -> list[Workload | Exception | None]:
        """One group of registrations (a workload) and deregistrations (None), in order:
        each is judged against the registry as the group's earlier calls leave it, the
        group's last state of each workload is stored in one write, and only then does
        memory take them, in order. A refused write refuses every call of the group
        (:class:`StoreUnavailable`) and leaves memory as it was."""
        async with self._lock:
            now = self._clock()
            staged: dict[str, Workload | None] = {}
            results: list[Workload | Exception | None] = []
            for workload_id, asked in calls:
                current = (
                    staged[workload_id] if workload_id in staged else self.workload(workload_id)
                )
                if asked is not None:
                    staged[workload_id] = replace(
                        asked,
                        registered_at=current.registered_at if current else now,
                        last_heartbeat=now,
                    )
                elif current is None and (
                    workload_id in staged or workload_id not in self._rejected
                ):
                    results.append(UnknownWorkload(workload_id))
                    continue
                else:
                    staged[workload_id] = None
                results.append(staged[workload_id])
            if not staged:
                return results
            try:
                await self.keeper.write(
                    [w for w in staged.values() if w is not None],
                    [i for i, w in staged.items() if w is None],
                )
            except StoreUnavailable as refused:
                return [self._refused(c, r, refused) for c, r in zip(calls, results, strict=True)]
            applied = [
                (CHANGED, self._apply(workload_id, result, now))
                for (workload_id, _), result in zip(calls, results, strict=True)
                if not isinstance(result, Exception)
            ]
        await self._send(applied)
        # one turn of the loop before the callers' answers are written: the watches (woken
        # by _count) send the changes first, and the catalog has them about 1.5 ms sooner
        await asyncio.sleep(0)
        return results

    def _refused(
        self, call: Call, result: Workload | Exception | None, refused: StoreUnavailable
    ) -> Exception:
        """A call of a group the store refused: the refusal, counted and logged (a call
        already refused on its own keeps its own answer)."""
        if isinstance(result, Exception):
            return result
        operation = "register" if call[1] is not None else "deregister"
        self._metrics.store_refusals.labels(operation).inc()
        log.debug(
            "workload.refused operation=%s workload=%s reason=store-unavailable",
            operation,
            call[0],
        )
        return refused

    def _apply(self, workload_id: str, workload: Workload | None, now: float) -> str:
        """Memory takes one stored call (under the lock); returns the workload's id."""
        self._rejected.overwritten(workload_id)
        if workload is not None:
            self._metrics.registrations.inc()
            self._count(self.registry.upsert(workload, now))
            log.debug(
                "workload.registered workload=%s services=%s address=%s ttl=%s",
                workload_id,
                ",".join(workload.services),
                workload.address,
                workload.ttl,
            )
        elif workload_id in self.registry.workloads:
            self._count(self.registry.remove(workload_id, now))
            log.debug("workload.deregistered workload=%s", workload_id)
        else:
            log.info("store.rejected_record_deleted workload=%s", workload_id)
        return workload_id

    def workload(self, workload_id: str) -> Workload | None:
        """The registration of ``workload_id``, if there is one."""
        return self.registry.workloads.get(workload_id)

    def workloads(self) -> list[tuple[Workload, bool]]:
        now = self._clock()
        return [
            (w, self.registry.counted(w, now)) for _, w in sorted(self.registry.workloads.items())
        ]

    # -- the store's outages -------------------------------------------------------------

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
            self._count(self.registry.declare(entries, workload_entries, self._clock()))
            for conflict in self.registry.conflicts:
                log.warning("declarations.conflict detail=%r", conflict)
            conflicts = list(self.registry.conflicts)
        return conflicts

    # -- expiry ------------------------------------------------------------------------

    async def expire_once(self) -> int:
        """Judge every workload's TTL, if this replica leads; returns the views changed.

        Those about to expire have their heartbeats read back from the store first: one
        another replica heard counts. A store that cannot say postpones the judgement, and
        holds every alive workload until it answers again and then one more TTL: the other
        replicas queue the heartbeats they could not write meanwhile (a Redis failover), and
        flush them once they reach the store themselves, which may be after this replica does.
        A replica that takes the judgement over from another gives every workload one TTL
        first, for the same reason; and every :data:`DEAD_RECHECK_SECONDS` the leader reads
        back the dead ones' heartbeats too, so that no lost signal keeps one dead. Right
        after that read, those dead for ``reap_after`` seconds are deregistered
        (:class:`~.reaping.Reaper`).
        """
        if not self._leading():
            self._led = False
            return 0
        now = self._clock()
        if self._led is False:  # taken over from another replica: see registry.taken_over
            log.info("expiry.taken_over grace=one-ttl count=%d", self.registry.taken_over(now))
        self._led = True
        due = self.registry.due(now)
        dead_read = now >= self._dead_read_at
        if dead_read:  # a revival whose signal this replica missed
            self._dead_read_at = now + DEAD_RECHECK_SECONDS
            due += self.registry.dead_with_ttl()
        if due:
            try:
                async with asyncio.timeout(self._signal_timeout):
                    heard = await self._store.heartbeats(due)
            except (TimeoutError, OSError, RedisError) as exc:
                log.warning("expiry.postponed due=%d reason=%s", len(due), type(exc).__name__)
                if not self._judgement_held:
                    self._judgement_held = True
                    held = self.registry.hold(now, counted=True)
                    log.warning("workloads.held count=%d reason=heartbeats-unreadable", held)
                return 0
        if self._judgement_held:
            self._judgement_held = False
            self._release()
        async with self._lock:
            if due:
                for workload_id, at in heard.items():
                    self.registry.adopt(workload_id, at)
            dead = self.registry.dead()
            changes, expired = self.registry.expire(self._clock())
            for workload_id in expired:
                log.warning("workload.expired workload=%s reason=no-heartbeat", workload_id)
            revived = sorted(dead - self.registry.dead() - set(expired))
            self._metrics.expirations.inc(len(expired))
            changed = self._count(changes)
            reaped, moved = await self.reaper.reap(self._clock()) if dead_read else ([], 0)
        verdicts = [(EXPIRED, i) for i in expired] + [(REVIVED, i) for i in revived]
        await self._send(verdicts + [(CHANGED, i) for i in reaped])
        return changed + moved

    # -- the other replicas' changes ------------------------------------------------------

    async def mirror(self, workload_ids: Iterable[str]) -> int:
        """Read these workloads back from the store (another replica changed them) and take
        what it holds; returns the views changed. Raises what the store raises."""
        ids = sorted(set(workload_ids))
        stored = await self._store.load(ids)
        gone = await self._store.deregistered([i for i in ids if stored.get(i) is None])
        async with self._lock:
            now = self._clock()
            changes: list[Change] = []
            for workload_id in ids:
                changes += self._take(workload_id, stored.get(workload_id), now, gone)
            return self._count(changes)

    async def mirror_all(self) -> int:
        """Take everything the store holds (after missed signals); returns the views changed."""
        loaded = await self._store.load_all()
        stored = {w.id: w for w in loaded.records}
        gone = await self._store.deregistered(
            [i for i in self.registry.workloads if i not in stored]
        )
        async with self._lock:
            now = self._clock()
            refused = {r.field for r in loaded.rejected}
            changes: list[Change] = []
            for workload_id in sorted(set(stored) | set(self.registry.workloads)):
                if workload_id not in refused:
                    changes += self._take(workload_id, stored.get(workload_id), now, gone)
            return self._count(changes)

    def _take(
        self, workload_id: str, stored: Workload | None, now: float, gone: set[str]
    ) -> list[Change]:
        """Memory takes the store's state of one workload (under the lock). A write of
        our own still queued for the store is ours to keep, and so is a workload missing
        from the store without a tombstone (``gone``): Redis lost it, it was not
        deregistered, and the leader writes it back."""
        if workload_id in self.keeper.rewrites:
            return []
        current = self.registry.workloads.get(workload_id)
        if stored is None:
            if current is None or workload_id not in gone:
                return []
            return self.registry.remove(workload_id, now)
        if current is not None and replace(current, last_heartbeat=0.0) == replace(
            stored, last_heartbeat=0.0
        ):
            self.registry.adopt(workload_id, stored.last_heartbeat)
            return []
        self._rejected.overwritten(workload_id)
        return self.registry.upsert(stored, now)

    async def verdict(self, workload_id: str, alive: bool) -> int:
        """The leader judged ``workload_id`` expired, or a replica heard it revive."""
        async with self._lock:
            return self._count(self.registry.judge(workload_id, alive, self._clock()))

    async def run_expiry(self, stop: asyncio.Event, interval: float = 0.5) -> None:
        await lifecycle.every(stop, interval, self.expire_once, "expiry")

    # -- views --------------------------------------------------------------------------

    def views(self, namespace: str = "") -> list[ServiceView]:
        return [
            v
            for k, v in sorted(self.registry.views.items())
            if not namespace or k.namespace == namespace
        ]

    def view(self, key: ServiceKey) -> ServiceView | None:
        return self.registry.views.get(key)

    # -- signals ------------------------------------------------------------------------

    def _count(self, changes: list[Change]) -> int:
        """Count ``changes`` (under the lock) and push them to the catalog's watches at
        once (:attr:`feed`); returns how many views changed."""
        self.revision += len(changes)
        self._metrics.changes.inc(len(changes))
        self.feed.changed(c.key for c in changes)
        return len(changes)

    async def _send(self, mirrored: Sequence[tuple[str, str]]) -> None:
        """Tell the other replicas (:class:`~.mirroring.Signals`), after the lock, in order."""
        await self._signals.send(mirrored)

    async def signalled(self) -> None:
        """Wait until every signal sent so far has been published or kept."""
        await self._signals.sent()
