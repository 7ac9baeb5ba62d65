"""The leader deregisters workloads that stayed expired for ``reap_after`` seconds.

Consul's ``deregister_critical_service_after``: a VM that was shut down for good and never
deregistered does not stay in the registry (and in the leader's read of the dead ones'
heartbeats every :data:`~trellis_endpoints_vm.manager.DEAD_RECHECK_SECONDS`) forever. A
reap is a deregistration like any other: stored with a tombstone first, so the other
replicas drop the workload as they drop one deregistered through them. The managers run on
the in-memory store and a fake clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import CHANGED, EndpointsManager, UnknownWorkload
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore

MakeWorkload = Callable[..., Workload]

NOW = 1_000.0
TTL = 10.0
REAP_AFTER = 60.0
API = ServiceKey("shop", "api")


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Refusing(InMemoryWorkloadStore):
    """Reads answer; writes fail while ``refuse_writes`` (a Redis that lost its replicas:
    ``WAIT`` unmet, reads fine)."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse_writes = False

    async def write(self, puts: Sequence[Workload], deletes: Sequence[str] = ()) -> None:
        if self.refuse_writes:
            raise ConnectionError("the store refuses writes")
        await super().write(puts, deletes)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def shared() -> Refusing:
    return Refusing()


async def manager_on(
    store: InMemoryWorkloadStore,
    clock: Clock,
    metrics: EndpointMetrics,
    *,
    reap_after: float = REAP_AFTER,
    leading: bool = True,
    sent: list[tuple[str, str]] | None = None,
) -> EndpointsManager:
    async def notify(kind: str, workload_id: str) -> int:
        if sent is not None:
            sent.append((kind, workload_id))
        return 1

    manager = EndpointsManager(
        store,
        metrics,
        clock=clock,
        reap_after=reap_after,
        leading=lambda: leading,
        notify=notify,
    )
    await manager.start()
    return manager


async def expired_one(
    store: InMemoryWorkloadStore,
    clock: Clock,
    metrics: EndpointMetrics,
    make: MakeWorkload,
    **kw: Any,
) -> EndpointsManager:
    """A leader with workload shop/vm-1 registered at NOW and expired at NOW + TTL."""
    manager = await manager_on(store, clock, metrics, **kw)  # kw: manager_on's options
    await manager.register(make(ttl=TTL))
    await sweep_at(manager, clock, NOW + TTL)
    assert manager.workloads()[0][1] is False
    return manager


async def sweep_at(manager: EndpointsManager, clock: Clock, at: float) -> int:
    """One expiry sweep at ``at``, on which the leader reads the dead ones' heartbeats."""
    clock.now = at
    manager._dead_read_at = 0.0  # the 2 s cadence is the sweep loop's, not this test's
    changed = await manager.expire_once()
    await manager.signalled()
    return changed


async def test_a_workload_expired_for_reap_after_is_deregistered_for_good(
    shared: Refusing,
    clock: Clock,
    metrics: EndpointMetrics,
    metrics_registry: CollectorRegistry,
    make_workload: MakeWorkload,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sent: list[tuple[str, str]] = []
    manager = await manager_on(shared, clock, metrics, sent=sent)
    await manager.register(make_workload("gone", ttl=TTL))
    await manager.register(make_workload("idle", address="10.0.0.2", ttl=TTL))
    await manager.register(make_workload("static", address="10.0.0.3"))  # no TTL
    clock.now = NOW + 5
    await manager.heartbeat("shop/idle")  # its TTL runs out 5 s later than gone's

    assert await sweep_at(manager, clock, NOW + 16) == 1  # both expire, one view
    assert [w.id for w, alive in manager.workloads() if not alive] == ["shop/gone", "shop/idle"]

    # "gone" has been expired REAP_AFTER - 1 s: kept, as "idle" is
    await sweep_at(manager, clock, NOW + TTL + REAP_AFTER - 1)
    assert set(manager.registry.workloads) == {"shop/gone", "shop/idle", "shop/static"}

    sent.clear()
    with caplog.at_level(logging.WARNING, logger="trellis_endpoints_vm.reaping"):
        await sweep_at(manager, clock, NOW + TTL + REAP_AFTER)
    assert set(manager.registry.workloads) == {"shop/idle", "shop/static"}
    assert "shop/gone" not in shared.workloads
    assert "shop/gone" in shared.tombstones  # the other replicas drop it, as deregistered
    assert sent == [(CHANGED, "shop/gone")]
    assert metrics_registry.get_sample_value("trellis_endpoints_vm_reaped_total") == 1.0
    reaped = [r.getMessage() for r in caplog.records if "workload.reaped" in r.getMessage()]
    assert reaped == ["workload.reaped workload=shop/gone expired_for_s=60 reap_after_s=60"]
    with pytest.raises(UnknownWorkload):
        await manager.heartbeat("shop/gone")  # its agent gets 404, and registers again

    # no TTL, never reaped; "idle" goes REAP_AFTER after its own TTL ran out
    await sweep_at(manager, clock, NOW + 5 + TTL + REAP_AFTER - 1)
    assert set(manager.registry.workloads) == {"shop/idle", "shop/static"}
    await sweep_at(manager, clock, NOW + 5 + TTL + REAP_AFTER)
    assert set(manager.registry.workloads) == {"shop/static"}
    assert [e.address for e in manager.view(API).endpoints] == ["10.0.0.3"]  # type: ignore[union-attr]


async def test_a_heartbeat_another_replica_stored_saves_it_from_the_reap(
    shared: Refusing, clock: Clock, metrics: EndpointMetrics, make_workload: MakeWorkload
) -> None:
    manager = await expired_one(shared, clock, metrics, make_workload)
    # another replica heard it just now and stored it; its signal never arrived
    reap_at = NOW + TTL + REAP_AFTER
    shared.heartbeat_times["shop/vm-1"] = reap_at - 1
    await sweep_at(manager, clock, reap_at)
    assert manager.workloads()[0][1] is True
    assert "shop/vm-1" in shared.workloads


async def test_a_store_that_refuses_the_deregistration_keeps_it_until_it_takes_it(
    shared: Refusing, clock: Clock, metrics: EndpointMetrics, make_workload: MakeWorkload
) -> None:
    manager = await expired_one(shared, clock, metrics, make_workload)
    shared.refuse_writes = True
    await sweep_at(manager, clock, NOW + TTL + REAP_AFTER)
    assert "shop/vm-1" in manager.registry.workloads  # memory as the store: still there
    assert "shop/vm-1" in shared.workloads

    shared.refuse_writes = False
    await manager.keeper.recover()  # the keeper's loop, once Redis takes writes again
    await sweep_at(manager, clock, NOW + TTL + REAP_AFTER + 1)
    assert "shop/vm-1" not in manager.registry.workloads
    assert "shop/vm-1" not in shared.workloads


async def test_only_the_leader_reaps_and_the_others_drop_what_it_reaped(
    shared: Refusing,
    clock: Clock,
    make_workload: MakeWorkload,
) -> None:
    leader = await manager_on(shared, clock, EndpointMetrics(CollectorRegistry()))
    other = await manager_on(shared, clock, EndpointMetrics(CollectorRegistry()), leading=False)
    await other.register(make_workload(ttl=TTL))
    await leader.mirror(["shop/vm-1"])
    await sweep_at(leader, clock, NOW + TTL)
    await other.verdict("shop/vm-1", alive=False)

    await sweep_at(other, clock, NOW + TTL + REAP_AFTER)  # a follower does not judge
    assert "shop/vm-1" in shared.workloads
    await sweep_at(leader, clock, NOW + TTL + REAP_AFTER)
    assert "shop/vm-1" not in shared.workloads
    assert await other.mirror(["shop/vm-1"]) == 1  # what its signal makes the other do
    assert "shop/vm-1" not in other.registry.workloads
    assert other.view(API) is None


async def test_reap_after_zero_never_reaps(
    shared: Refusing, clock: Clock, metrics: EndpointMetrics, make_workload: MakeWorkload
) -> None:
    manager = await expired_one(shared, clock, metrics, make_workload, reap_after=0)
    await sweep_at(manager, clock, NOW + 1_000_000)
    assert "shop/vm-1" in manager.registry.workloads
    assert "shop/vm-1" in shared.workloads
