"""Fakes for tests of code that uses endpoints-vm's seams."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from trellis_common.stored import Rejected
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.store import Loaded


class InMemoryWorkloadStore:
    """A :class:`~trellis_endpoints_vm.store.WorkloadStore` in a dict.

    ``down`` makes every call raise ``ConnectionError`` (Redis unreachable); ``rejected``
    are records ``load_all`` reports as refused, as a Redis holding corrupt ones would.
    """

    def __init__(self) -> None:
        self.workloads: dict[str, Workload] = {}
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
        for workload_id in deletes:
            self.workloads.pop(workload_id, None)
        written = {w.id for w in puts} | set(deletes)  # a bad record is overwritten too
        self.rejected = [r for r in self.rejected if r.field not in written]

    async def load_all(self) -> Loaded:
        self._check()
        return Loaded(list(self.workloads.values()), list(self.rejected))

    async def missing(self, workload_ids: Collection[str], extra: int = 0) -> list[str]:
        self._check()
        return sorted(set(workload_ids) - set(self.workloads))

    async def ping(self) -> None:
        self._check()
