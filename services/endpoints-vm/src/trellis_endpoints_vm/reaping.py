"""Workloads expired for good: deregistered by the leader after ``reap_after`` seconds.

A workload with a TTL whose heartbeats stopped is taken out of its services and kept, so
that its next heartbeat brings it back. One that stays expired for ``reap_after`` seconds
(an hour by default; 0: never) is deregistered, as Consul's
``deregister_critical_service_after`` does: a VM shut down for good does not stay in the
registry, nor in the leader's read-back of the dead ones' heartbeats, for ever. Its agent's
next heartbeat gets 404, and registers again.

The leader reaps right after it has read the dead ones' heartbeats back from the store
(:meth:`~trellis_endpoints_vm.manager.EndpointsManager.expire_once`), so a heartbeat another
replica stored meanwhile saves the workload. A reap is an ordinary deregistration: stored
first, with a tombstone, so the other replicas drop the workload as they drop any
deregistration, then taken out of memory. A store that refuses leaves it for the next sweep.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from prometheus_client import Counter

from trellis_endpoints_vm.domain.registry import Change, EndpointRegistry
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.keeper import StoreKeeper, StoreUnavailable

log = logging.getLogger(__name__)

#: How long a workload with a TTL may stay expired before the leader deregisters it (the
#: ``reap_after`` setting's default; 0: never).
REAP_AFTER_SECONDS = 3600.0


class Reaper:
    """The manager's reaping: which workloads are due, and their deregistration."""

    def __init__(
        self,
        registry: EndpointRegistry,
        keeper: StoreKeeper,
        count: Callable[[list[Change]], int],
        reaped: Counter,
        reap_after: float = REAP_AFTER_SECONDS,
    ) -> None:
        self._registry = registry
        self._keeper = keeper
        self._count = count  # the manager's: counts the changes and pushes them
        self._reaped = reaped
        self.reap_after = reap_after

    def reaped_at(self, workload: Workload) -> float | None:
        """When ``workload`` is deregistered if no heartbeat comes (None: no TTL, or reaping
        is off): ``reap_after`` past the end of its TTL."""
        expires_at = workload.expires_at
        return None if expires_at is None or self.reap_after <= 0 else expires_at + self.reap_after

    async def reap(self, now: float) -> tuple[list[str], int]:
        """Deregister the workloads expired for ``reap_after`` seconds or more (called under
        the manager's lock); returns the ids reaped and the views changed."""
        if self.reap_after <= 0:
            return [], 0
        rewrites = self._keeper.rewrites  # a write of ours still queued is not judged yet
        ids = [i for i in self._registry.reapable(now, self.reap_after) if i not in rewrites]
        if not ids:
            return [], 0
        try:
            await self._keeper.write([], ids)
        except StoreUnavailable:
            log.warning("workloads.reap_postponed count=%d reason=store-unavailable", len(ids))
            return [], 0
        moved = 0
        for workload_id in ids:
            workload = self._registry.workloads[workload_id]
            moved += self._count(self._registry.remove(workload_id, now))
            log.warning(
                "workload.reaped workload=%s expired_for_s=%.0f reap_after_s=%g",
                workload_id,
                now - (workload.expires_at or now),
                self.reap_after,
            )
        self._reaped.inc(len(ids))
        return ids, moved
