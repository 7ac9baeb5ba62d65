"""Fakes for tests of code that uses endpoints-vm's seams."""

from __future__ import annotations

from trellis_endpoints_vm.domain.workloads import Workload


class InMemoryWorkloadStore:
    """A :class:`~trellis_endpoints_vm.store.WorkloadStore` in a dict."""

    def __init__(self) -> None:
        self.workloads: dict[str, Workload] = {}

    async def put(self, workload: Workload) -> None:
        self.workloads[workload.id] = workload

    async def delete(self, workload_id: str) -> None:
        self.workloads.pop(workload_id, None)

    async def load_all(self) -> list[Workload]:
        return list(self.workloads.values())
