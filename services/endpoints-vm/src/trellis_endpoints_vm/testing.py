"""Fakes for tests of code that uses endpoints-vm's seams."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.store import Loaded
from trellis_runtime.stored import Rejected


class InMemoryWorkloadStore:
    """A :class:`~trellis_endpoints_vm.store.WorkloadStore` in a dict.

    ``down`` makes every call raise ``ConnectionError`` (Redis unreachable); ``rejected``
    are records ``load_all`` reports as refused, as a Redis holding corrupt ones would.
    Heartbeats are kept apart from the records, as in Redis (``heartbeats``).
    """

    def __init__(self) -> None:
        self.workloads: dict[str, Workload] = {}
        self.heartbeat_times: dict[str, float] = {}
        self.tombstones: dict[str, float] = {}
        self.rejected: list[Rejected] = []
        self.down = False
        self.writes = 0

    def _check(self) -> None:
        if self.down:
            raise ConnectionError("the store is down")

    async def put(self, workload: Workload) -> None:
        await self.write([workload])

    async def delete(self, workload_id: str) -> None:
        await self.write([], [workload_id])

    async def write(self, puts: Sequence[Workload], deletes: Sequence[str] = ()) -> None:
        self._check()
        self.writes += 1
        for workload in puts:
            self.workloads[workload.id] = workload
            self.tombstones.pop(workload.id, None)
        for workload_id in deletes:
            self.workloads.pop(workload_id, None)
            self.heartbeat_times.pop(workload_id, None)
            self.tombstones[workload_id] = time.time()
        written = {w.id for w in puts} | set(deletes)  # a bad record is overwritten too
        self.rejected = [r for r in self.rejected if r.field not in written]

    async def beat(self, heartbeats: Sequence[tuple[str, float]]) -> None:
        self._check()
        self.writes += 1
        self.heartbeat_times.update(heartbeats)

    async def heartbeats(self, workload_ids: Sequence[str]) -> dict[str, float]:
        self._check()
        return {i: self.heartbeat_times[i] for i in workload_ids if i in self.heartbeat_times}

    async def deregistered(self, workload_ids: Sequence[str]) -> set[str]:
        self._check()
        return {i for i in workload_ids if i in self.tombstones}

    async def prune(self, tombstone_age: float, tombstone_limit: int | None = None) -> int:
        self._check()
        orphans = [i for i in self.heartbeat_times if i not in self.workloads]
        old = [i for i, at in self.tombstones.items() if at < time.time() - tombstone_age]
        if tombstone_limit is not None:
            kept = sorted((at, i) for i, at in self.tombstones.items() if i not in old)
            old += [i for _, i in kept[: max(0, len(kept) - tombstone_limit)]]
        for i in orphans:
            del self.heartbeat_times[i]
        for i in old:
            del self.tombstones[i]
        return len(orphans) + len(old)

    async def load(self, workload_ids: Sequence[str]) -> dict[str, Workload | None]:
        self._check()
        return {i: self._merged(i) for i in workload_ids}

    def _merged(self, workload_id: str) -> Workload | None:
        workload = self.workloads.get(workload_id)
        beat = self.heartbeat_times.get(workload_id)
        if workload is None or beat is None or beat <= workload.last_heartbeat:
            return workload
        return workload.beat(beat)

    async def load_all(self) -> Loaded:
        self._check()
        merged = [self._merged(i) for i in self.workloads]
        return Loaded([w for w in merged if w is not None], list(self.rejected))

    async def missing(self, workload_ids: Collection[str], extra: int = 0) -> list[str]:
        self._check()
        return sorted(set(workload_ids) - set(self.workloads) - set(self.tombstones))

    async def ping(self) -> None:
        self._check()
