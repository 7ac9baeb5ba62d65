"""The registry of endpoints: registered workloads and declarations, resolved to views.

All state changes go through methods that return the services whose view changed, each
with its new view (or ``None`` when the service is gone). Only the services a change can
touch are recomputed: a workload touches the services it names and the ServiceEntries of
its namespace whose selector matches its labels (before or after the change); a reload of
declarations touches every service an entry names, before and after. A service that only
registrations fill is kept in parts (:mod:`~trellis_endpoints_vm.domain.listed`), so a
change to one of its workloads moves that workload's part, not all of them.

A workload with a TTL is alive while its heartbeats keep coming, or while the control plane
owes it a *grace*: when its heartbeats cannot be persisted (Redis is down), the manager
:meth:`~EndpointRegistry.hold`-s it, and on recovery :meth:`~EndpointRegistry.release` gives
it one more TTL from then; and after endpoints-vm's own restart every workload gets one TTL
from then (:meth:`~EndpointRegistry.restarted`), since its heartbeats could not arrive
meanwhile (if it had beaten within two TTLs). A workload never expires because the control
plane could not write or was not there to hear it.

Judging and counting are apart. :meth:`~EndpointRegistry.expire` *judges* by the clock
(:meth:`~EndpointRegistry.is_alive`) and records a verdict per workload; views and
listings *count* by the verdict (:meth:`~EndpointRegistry.counted`), so views, expiry and
listings agree. A registration, a heartbeat that revives, a grace, and another replica's
verdict (:meth:`~EndpointRegistry.judge`) also set it. With replicas, only the leader
judges (its heartbeats heard by other replicas are adopted first:
:meth:`~EndpointRegistry.adopt`), and the others take its verdicts: a workload whose
heartbeats reach one replica is never taken out by another's clock.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from trellis_common.memo import sorted_unique
from trellis_endpoints_vm.domain.declarations import DeclaredEndpoint, DeclaredEntry
from trellis_endpoints_vm.domain.listed import Listed
from trellis_endpoints_vm.domain.views import (
    ServiceInfo,
    ServiceKey,
    ServiceView,
)
from trellis_endpoints_vm.domain.workloads import Workload


@dataclass(frozen=True, slots=True)
class Change:
    key: ServiceKey
    view: ServiceView | None  # None: the service is gone


class UnknownWorkload(LookupError):
    def __init__(self, workload_id: str) -> None:
        super().__init__(f"no workload {workload_id!r} is registered")
        self.workload_id = workload_id


class EndpointRegistry:
    def __init__(self) -> None:
        self.workloads: dict[str, Workload] = {}
        self.views: dict[ServiceKey, ServiceView] = {}
        self._alive: dict[str, bool] = {}
        self._grace: dict[str, float] = {}  # workload id -> alive until (inf: held)
        self._by_service: dict[ServiceKey, set[str]] = defaultdict(set)
        self._entries: dict[str, DeclaredEntry] = {}
        self._workload_entries: dict[str, DeclaredEndpoint] = {}
        self._entry_for_host: dict[ServiceKey, str] = {}
        self._selecting: dict[str, list[DeclaredEntry]] = defaultdict(list)
        self.conflicts: list[str] = []
        #: registered services' views in parts: a change to one workload moves one part
        self._listed: dict[ServiceKey, Listed] = {}

    # -- registered workloads --------------------------------------------------------

    def upsert(self, workload: Workload, now: float) -> list[Change]:
        old = self.workloads.get(workload.id)
        touched = self._touched_by(old) | self._touched_by(workload)
        if old is not None:
            for service in old.services:
                self._by_service[ServiceKey(old.namespace, service)].discard(old.id)
        self.workloads[workload.id] = workload
        self._grace.pop(workload.id, None)
        self._alive[workload.id] = self.is_alive(workload, now)
        for service in workload.services:
            self._by_service[ServiceKey(workload.namespace, service)].add(workload.id)
        return self._recompute(touched, now, [workload.id])

    def remove(self, workload_id: str, now: float) -> list[Change]:
        old = self.workloads.pop(workload_id, None)
        if old is None:
            raise UnknownWorkload(workload_id)
        self._alive.pop(workload_id, None)
        self._grace.pop(workload_id, None)
        for service in old.services:
            key = ServiceKey(old.namespace, service)
            self._by_service[key].discard(old.id)
            if not self._by_service[key]:
                del self._by_service[key]
        return self._recompute(self._touched_by(old), now, [workload_id])

    def heartbeat(self, workload_id: str, now: float) -> tuple[Workload, list[Change]]:
        """A heartbeat at ``now``: the changes are those of a revival (none if it was
        counted alive already)."""
        current = self.workloads.get(workload_id)
        if current is None:
            raise UnknownWorkload(workload_id)
        beaten = current.beat(max(now, current.last_heartbeat))
        self.workloads[workload_id] = beaten
        if self._alive.get(workload_id):
            return beaten, []
        self._alive[workload_id] = True
        return beaten, self._recompute(self._touched_by(beaten), now, [workload_id])

    def adopt(self, workload_id: str, last_heartbeat: float) -> bool:
        """A heartbeat another replica heard (read back from the store): the time is kept
        for the next judgement, the verdict stays. Returns whether it was newer."""
        current = self.workloads.get(workload_id)
        if current is None or last_heartbeat <= current.last_heartbeat:
            return False
        self.workloads[workload_id] = current.beat(last_heartbeat)
        return True

    def judge(self, workload_id: str, alive: bool, now: float) -> list[Change]:
        """Take the leader's verdict on ``workload_id`` (expired, or revived elsewhere)."""
        current = self.workloads.get(workload_id)
        if current is None or self._alive.get(workload_id) == alive:
            return []
        self._alive[workload_id] = alive
        if alive:
            self.workloads[workload_id] = current.beat(max(now, current.last_heartbeat))
        return self._recompute(self._touched_by(current), now, [workload_id])

    def due(self, now: float) -> list[str]:
        """The workloads counted alive that :meth:`expire` would take out at ``now``."""
        return [
            workload_id
            for workload_id, workload in self.workloads.items()
            if workload.ttl is not None
            and self._alive.get(workload_id)
            and not self.is_alive(workload, now)
        ]

    def dead(self) -> set[str]:
        """The workloads counted dead now."""
        return {workload_id for workload_id, alive in self._alive.items() if not alive}

    def expire(self, now: float) -> tuple[list[Change], list[str]]:
        """Take out workloads whose heartbeats stopped; returns the changes and who expired."""
        touched: set[ServiceKey] = set()
        judged, expired = [], []
        for workload_id, workload in self.workloads.items():
            if workload.ttl is None:
                continue
            alive = self.is_alive(workload, now)
            if alive != self._alive.get(workload_id):
                self._alive[workload_id] = alive
                touched |= self._touched_by(workload)
                judged.append(workload_id)
                if not alive:
                    expired.append(workload_id)
        for workload_id, until in list(self._grace.items()):
            if until <= now:
                del self._grace[workload_id]
        return self._recompute(touched, now, judged), expired

    # -- grace: liveness the control plane owes a workload -----------------------------

    def is_alive(self, workload: Workload, now: float) -> bool:
        """Alive by its own heartbeats, or within a grace granted by :meth:`release`: the
        judgement :meth:`expire` makes."""
        return workload.alive(now) or now < self._grace.get(workload.id, -math.inf)

    def counted(self, workload: Workload, now: float) -> bool:
        """Whether views count ``workload``: its last verdict (the clock's for one judged
        never yet)."""
        verdict = self._alive.get(workload.id)
        return self.is_alive(workload, now) if verdict is None else verdict

    def hold(
        self, now: float, workload_ids: Iterable[str] | None = None, *, counted: bool = False
    ) -> int:
        """Keep alive, until :meth:`release`, these workloads (default: every alive one;
        ``counted``: every one whose last verdict is alive, those due for judgement too).

        Returns how many are held now. Workloads already dead stay dead: their heartbeats
        stopped before the control plane lost its store.
        """
        ids = list(self.workloads) if workload_ids is None else workload_ids
        alive = self.counted if counted else self.is_alive
        for workload_id in ids:
            workload = self.workloads.get(workload_id)
            if workload is not None and workload.ttl is not None and alive(workload, now):
                self._grace[workload_id] = math.inf
        return sum(1 for until in self._grace.values() if until == math.inf)

    def release(self, now: float) -> int:
        """End every hold: each held workload stays alive one more TTL from ``now``."""
        released = 0
        for workload_id, until in list(self._grace.items()):
            workload = self.workloads.get(workload_id)
            if workload is None or workload.ttl is None:
                del self._grace[workload_id]
            elif until == math.inf:
                self._grace[workload_id] = now + workload.ttl
                released += 1
        return released

    def restarted(self, now: float) -> tuple[int, list[Change]]:
        """After endpoints-vm's own restart, a workload with a TTL that beat within the last
        two TTLs stays alive one more TTL from ``now``: the heartbeats it sent while
        endpoints-vm was restarting could not arrive, and that time is not held against it
        (one that really stopped is taken out one TTL later). A workload silent for longer
        is judged by its heartbeats alone: a long outage cannot be told from its death.
        Returns how many got the grace, and the views that changed."""
        touched: set[ServiceKey] = set()
        revived = []
        granted = 0
        for workload in self.workloads.values():
            if workload.ttl is not None and now - workload.last_heartbeat < 2 * workload.ttl:
                until = now + workload.ttl
                self._grace[workload.id] = max(self._grace.get(workload.id, until), until)
                if not self._alive.get(workload.id):
                    touched |= self._touched_by(workload)
                    revived.append(workload.id)
                self._alive[workload.id] = True
                granted += 1
        return granted, self._recompute(touched, now, revived)

    def taken_over(self, now: float) -> int:
        """The judgement moved to this replica: every workload with a TTL counted alive
        stays alive one more TTL from ``now`` (a hold stays a hold). What moves a lease is
        a Redis failover, and the replica that heard a workload's heartbeats meanwhile may
        not have stored them yet; the time nobody judged is not held against it, as a new
        Kubernetes node controller does not judge a node by its silence before it led.
        Returns how many got the grace."""
        granted = 0
        for workload in self.workloads.values():
            if workload.ttl is not None and self._alive.get(workload.id):
                until = now + workload.ttl
                self._grace[workload.id] = max(self._grace.get(workload.id, until), until)
                granted += 1
        return granted

    def dead_with_ttl(self) -> list[str]:
        """The workloads counted dead that a heartbeat would revive."""
        return [
            workload.id
            for workload in self.workloads.values()
            if workload.ttl is not None and self._alive.get(workload.id) is False
        ]

    def reapable(self, now: float, after: float) -> list[str]:
        """The workloads counted dead whose TTL ran out ``after`` seconds or more before
        ``now`` (and that no grace covers): what :meth:`remove` takes for good once they
        have been dead that long, as Consul's ``deregister_critical_service_after`` does."""
        return [
            workload.id
            for workload in self.workloads.values()
            if workload.ttl is not None
            and self._alive.get(workload.id) is False
            and workload.id not in self._grace
            and workload.last_heartbeat + workload.ttl + after <= now
        ]

    def grace_until(self, workload_id: str) -> float | None:
        """The end of a workload's grace (``inf`` while held), or ``None``."""
        return self._grace.get(workload_id)

    # -- declarations (ServiceEntry, WorkloadEntry) -------------------------------------

    def declare(
        self,
        entries: Iterable[DeclaredEntry],
        workload_entries: Iterable[DeclaredEndpoint],
        now: float,
    ) -> list[Change]:
        touched = set(self._entry_for_host)
        self._entries = {e.id: e for e in sorted(entries, key=lambda e: e.id)}
        self._workload_entries = {w.workload: w for w in workload_entries}
        self._entry_for_host = {}
        self._selecting = defaultdict(list)
        self.conflicts = []
        for entry in self._entries.values():
            if entry.selector is not None:
                self._selecting[entry.namespace].append(entry)
            for key in entry.service_keys():
                owner = self._entry_for_host.setdefault(key, entry.id)
                if owner != entry.id:
                    self.conflicts.append(
                        f"ServiceEntry {entry.id}: host {key.name!r} is already declared by "
                        f"ServiceEntry {owner}; this host of {entry.id} is ignored"
                    )
        touched |= set(self._entry_for_host)
        return self._recompute(touched, now)

    # -- views ------------------------------------------------------------------------

    def _touched_by(self, workload: Workload | None) -> set[ServiceKey]:
        if workload is None:
            return set()
        keys = {ServiceKey(workload.namespace, s) for s in workload.services}
        labels = workload.label_map()
        for entry in self._selecting.get(workload.namespace, ()):
            if entry.selects(labels):
                keys.update(
                    k for k in entry.service_keys() if self._entry_for_host.get(k) == entry.id
                )
        return keys

    def _recompute(
        self, keys: Iterable[ServiceKey], now: float, moved: Collection[str] | None = None
    ) -> list[Change]:
        """The views of ``keys`` again; ``moved``: the only workloads whose state changed
        (their registration, membership or verdict), None: anything may have."""
        changes = []
        for key in sorted(keys):
            view = self._view(key, now, moved)
            if view != self.views.get(key):
                if view is None:
                    del self.views[key]
                else:
                    self.views[key] = view
                changes.append(Change(key, view))
        return changes

    def members(self, key: ServiceKey) -> list[Workload]:
        """The workloads registered for the service ``key`` (alive or not), by id."""
        return [self.workloads[i] for i in sorted(self._by_service.get(key, ()))]

    def _view(
        self, key: ServiceKey, now: float, moved: Collection[str] | None = None
    ) -> ServiceView | None:
        entry_id = self._entry_for_host.get(key)
        entry = self._entries.get(entry_id) if entry_id else None
        if entry is None:
            return self._registered_view(key, now, moved)
        self._listed.pop(key, None)
        endpoints = [w.endpoint() for w in self.members(key) if self.counted(w, now)]
        endpoints += entry.resolve(key.name, self._selected(entry, now))
        return ServiceView(entry.info(key.name), sorted_unique(endpoints))

    def _registered_view(
        self, key: ServiceKey, now: float, moved: Collection[str] | None
    ) -> ServiceView | None:
        """A service only registrations fill: its parts (:class:`Listed`) moved by the
        workloads that ``moved``, or made again from every member."""
        listed = self._listed.get(key)
        if listed is None or moved is None:
            listed = self._listed[key] = Listed()
            moved = self._by_service.get(key, ())
        members = self._by_service.get(key, ())
        for workload_id in moved:
            workload = self.workloads.get(workload_id) if workload_id in members else None
            if workload is not None or workload_id in listed.members:
                counted = workload is not None and self.counted(workload, now)
                listed.move(workload_id, workload, counted)
        if not listed.members:
            del self._listed[key]
            return None
        return ServiceView(ServiceInfo(key=key, ports=listed.ports), listed.endpoints)

    def _selected(self, entry: DeclaredEntry, now: float) -> list[DeclaredEndpoint]:
        if entry.selector is None:
            return []
        found = [
            we
            for we in self._workload_entries.values()
            if we.workload.split("/", 1)[0] == entry.namespace and entry.selects(dict(we.labels))
        ]
        for workload in self.workloads.values():
            if (
                workload.namespace == entry.namespace
                and self.counted(workload, now)
                and entry.selects(workload.label_map())
            ):
                found.append(
                    DeclaredEndpoint(
                        address=workload.address,
                        ports=dict(workload.ports),
                        labels=workload.labels,
                        locality=workload.locality,
                        network=workload.network,
                        weight=workload.weight,
                        service_account=workload.service_account or "default",
                        workload=workload.id,
                        source="registration",
                    )
                )
        return found
