"""Registrations and deregistrations committed in groups: one lock and one store write for
every call that arrived while the last group was being written, each call with its own
answer, in order."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest
from prometheus_client import CollectorRegistry

from trellis_endpoints_vm.commits import GroupCommit
from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import EndpointsManager, StoreUnavailable, UnknownWorkload
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore

MakeWorkload = Callable[..., Workload]
API = ServiceKey("shop", "api")


class GatedStore(InMemoryWorkloadStore):
    """A store whose writes wait for ``gate`` while it is clear, and record each write."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()  # set when a write begins (before the gate)
        self.written: list[tuple[list[str], list[str]]] = []

    async def write(self, puts: Sequence[Workload], deletes: Sequence[str] = ()) -> None:
        self.entered.set()
        await self.gate.wait()
        await super().write(puts, deletes)
        self.written.append(([w.id for w in puts], list(deletes)))


@pytest.fixture
async def gated(metrics: EndpointMetrics) -> tuple[EndpointsManager, GatedStore]:
    store = GatedStore()
    manager = EndpointsManager(store, metrics, clock=lambda: 1_000.0)
    await manager.start()
    return manager, store


# -- the mechanism --------------------------------------------------------------------


async def test_calls_that_arrive_during_a_commit_go_together_in_the_next() -> None:
    groups: list[list[int]] = []
    writing, release = asyncio.Event(), asyncio.Event()

    async def commit(calls: Sequence[int]) -> list[int | Exception]:
        groups.append(list(calls))
        if len(groups) == 1:
            writing.set()
            await release.wait()
        return [c * 10 if c % 3 else ValueError(f"no {c}") for c in calls]

    commits: GroupCommit[int, int] = GroupCommit(commit)
    first = asyncio.create_task(commits.submit(1))
    await writing.wait()  # the first group is being written
    # made before the release: they submit before the first group's write resumes
    later = [asyncio.create_task(commits.submit(c)) for c in (2, 3, 4)]
    assert groups == [[1]]
    release.set()
    assert await first == 10
    assert await later[0] == 20
    with pytest.raises(ValueError, match="no 3"):
        await later[1]
    assert await later[2] == 40
    assert groups == [[1], [2, 3, 4]]
    assert (commits.groups, commits.calls) == (2, 4)
    assert await commits.submit(5) == 50  # idle again: alone
    assert groups[-1] == [5]


async def test_a_group_that_fails_fails_every_call_in_it_and_the_next_goes_on() -> None:
    failing = True

    async def commit(calls: Sequence[str]) -> list[str | Exception]:
        if failing:
            raise ConnectionError("the store is down")
        return list(calls)

    commits: GroupCommit[str, str] = GroupCommit(commit)
    results = await asyncio.gather(*(commits.submit(c) for c in "abc"), return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError] * 3
    failing = False
    assert await commits.submit("d") == "d"


async def test_a_caller_that_goes_away_still_has_its_call_committed() -> None:
    writing, release, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()
    committed: list[str] = []

    async def commit(calls: Sequence[str]) -> list[str | Exception]:
        writing.set()
        await release.wait()
        committed.extend(calls)
        finished.set()
        return [RuntimeError("refused") for _ in calls]  # nobody hears this one: no warning

    commits: GroupCommit[str, str] = GroupCommit(commit)
    caller = asyncio.create_task(commits.submit("x"))
    await writing.wait()  # the call is in a group being written
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    await asyncio.wait_for(finished.wait(), 5)
    assert committed == ["x"]


async def test_a_commit_with_the_wrong_number_of_results_fails_each_call() -> None:
    async def commit(calls: Sequence[int]) -> list[int | Exception]:
        return [1]

    commits: GroupCommit[int, int] = GroupCommit(commit)
    results = await asyncio.gather(commits.submit(1), commits.submit(2), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and "1 results for 2 calls" in str(r) for r in results)


# -- the manager's groups ---------------------------------------------------------------


async def test_concurrent_registrations_are_one_write_and_each_gets_its_record(
    gated: tuple[EndpointsManager, GatedStore], make_workload: MakeWorkload
) -> None:
    manager, store = gated
    store.gate.clear()
    first = asyncio.create_task(manager.register(make_workload("vm-0", address="10.0.0.9")))
    await store.entered.wait()  # its write waits on the gate
    assert manager.registry.workloads == {}  # nothing served before it is stored
    # made before the gate opens: they submit before the first write resumes, and queue
    rest = [
        asyncio.create_task(manager.register(make_workload(f"vm-{i}", address=f"10.0.0.{i}")))
        for i in range(1, 9)
    ]
    store.gate.set()
    records = [await first, *[await r for r in rest]]
    assert [r.id for r in records] == [f"shop/vm-{i}" for i in range(9)]
    assert all(r.registered_at == r.last_heartbeat == 1_000.0 for r in records)
    assert store.written == [(["shop/vm-0"], []), ([f"shop/vm-{i}" for i in range(1, 9)], [])]
    assert set(store.workloads) == set(manager.registry.workloads) == {r.id for r in records}
    view = manager.view(API)
    assert view is not None
    assert len(view.endpoints) == 9
    assert (manager.commits.groups, manager.commits.calls) == (2, 9)


async def test_a_group_is_judged_in_order_and_stores_each_workloads_last_state(
    gated: tuple[EndpointsManager, GatedStore], make_workload: MakeWorkload
) -> None:
    manager, store = gated
    kept = await manager.register(make_workload("vm-1"))
    store.gate.clear()
    store.entered.clear()
    blocker = asyncio.create_task(manager.register(make_workload("vm-0")))
    await store.entered.wait()  # its write waits on the gate; these queue behind it
    calls = [
        manager.register(make_workload("vm-2", address="10.0.0.2")),
        manager.deregister("shop/vm-2"),  # the one just registered, in this group
        manager.deregister("shop/vm-2"),  # gone already: unknown, alone
        manager.deregister("shop/vm-404"),  # never known
        manager.register(make_workload("vm-1", address="10.0.0.11")),  # again: moved
    ]
    answers = asyncio.gather(*calls, return_exceptions=True)  # submitted before the gate opens
    store.gate.set()
    await blocker
    results = await answers
    assert [type(r).__name__ for r in results] == [
        "Workload",
        "NoneType",
        "UnknownWorkload",
        "UnknownWorkload",
        "Workload",
    ]
    assert isinstance(results[2], UnknownWorkload)
    moved = results[4]
    assert isinstance(moved, Workload)
    assert moved.registered_at == kept.registered_at  # registered again, not anew
    assert store.written[-1] == (["shop/vm-1"], ["shop/vm-2"])  # the last state of each
    assert "shop/vm-2" not in manager.registry.workloads
    assert store.workloads["shop/vm-1"].address == "10.0.0.11"
    assert sorted(e.address for e in manager.view(API).endpoints) == [  # type: ignore[union-attr]
        "10.0.0.1",
        "10.0.0.11",
    ]


async def test_a_refused_group_refuses_every_call_and_memory_stays(
    gated: tuple[EndpointsManager, GatedStore],
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    manager, store = gated
    await manager.register(make_workload("vm-1"))
    revision, views = manager.revision, manager.views()
    store.down = True
    results = await asyncio.gather(
        manager.register(make_workload("vm-2", address="10.0.0.2")),
        manager.register(make_workload("vm-3", address="10.0.0.3")),
        manager.deregister("shop/vm-1"),
        manager.deregister("shop/vm-404"),
        return_exceptions=True,
    )
    assert [type(r).__name__ for r in results] == [
        "StoreUnavailable",
        "StoreUnavailable",
        "StoreUnavailable",
        "UnknownWorkload",  # judged before the write: its own answer
    ]
    assert isinstance(results[0], StoreUnavailable)
    assert (manager.revision, manager.views()) == (revision, views)
    assert list(manager.registry.workloads) == ["shop/vm-1"]
    refused = {
        operation: metrics_registry.get_sample_value(
            "trellis_endpoints_vm_store_refusals_total", {"operation": operation}
        )
        for operation in ("register", "deregister")
    }
    assert refused == {"register": 2.0, "deregister": 1.0}
