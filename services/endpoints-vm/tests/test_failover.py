"""Two replicas over one store that fails over, as Redis under Sentinel does when its
master is killed: the judgement of TTLs must come through it with no workload lost.

Replica H hears every heartbeat (an agent keeps one connection, to one replica); replica N
is the other. No signals pass between them here, so each verdict is seen where it is made:
what N decides comes from the store alone. The store's outage is ``down``; after it, a
new master that has no replica yet refuses the writes that wait for one (``WAIT``: whole
records) and takes the rest (heartbeats).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.keeper import StoreUnavailable
from trellis_endpoints_vm.manager import DEAD_RECHECK_SECONDS, EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore

MakeWorkload = Callable[..., Workload]
TTL = 5.0
VM = "bookstore/v1-a"


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


class NotReplicated(ConnectionError):
    """A write that waits for a replica, on a new master without one."""


class FailingOver(InMemoryWorkloadStore):
    """The store after a failover: readable, heartbeats taken, whole records refused while
    ``unreplicated``."""

    unreplicated = False

    async def write(self, puts: Sequence[Workload], deletes: Sequence[str] = ()) -> None:
        self._check()
        if self.unreplicated:
            raise NotReplicated("NOREPLICAS not enough good replicas to write")
        await super().write(puts, deletes)


@dataclass
class Replica:
    manager: EndpointsManager
    leads: bool = False

    def alive(self) -> bool:
        return [alive for w, alive in self.manager.workloads() if w.id == VM] == [True]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store() -> FailingOver:
    return FailingOver()


async def replica(store: FailingOver, clock: Clock) -> Replica:
    made = Replica(None)  # type: ignore[arg-type]  # just below
    made.manager = EndpointsManager(
        store, EndpointMetrics(CollectorRegistry()), clock=clock, leading=lambda: made.leads
    )
    await made.manager.start()
    return made


@pytest.fixture
async def steady(
    store: FailingOver, clock: Clock, make_workload: MakeWorkload
) -> tuple[Replica, Replica]:
    """H leads and hears a heartbeat every second, written behind at once; N sweeps too,
    as a standby does, judging nothing."""
    h, n = await replica(store, clock), await replica(store, clock)
    h.leads = True
    vm = make_workload("v1-a", services=("bookstore-v1",), namespace="bookstore", ttl=TTL)
    await h.manager.register(vm)
    await n.manager.mirror([VM])
    for _ in range(5):
        clock.now += 1
        await h.manager.heartbeat(VM)
        await h.manager.keeper.flush()
        assert await h.manager.expire_once() == 0
        assert await n.manager.expire_once() == 0
    return h, n


async def beat(h: Replica, clock: Clock, seconds: float = 1.0) -> None:
    """The agent's next heartbeat, to H, which writes it behind, or retries the store as
    its keeper's loop does while the store is unavailable."""
    clock.now += seconds
    await h.manager.heartbeat(VM)
    if not await h.manager.keeper.write_behind():
        with contextlib.suppress(ConnectionError):
            await h.manager.keeper.recover()


async def test_the_replica_that_takes_the_judgement_over_gives_every_workload_a_ttl(
    steady: tuple[Replica, Replica], store: FailingOver, clock: Clock
) -> None:
    h, n = steady
    store.down, h.leads = True, False  # the master is killed; H's lease cannot be renewed
    for _ in range(6):  # longer than the TTL: H answers the heartbeats and queues them
        await beat(h, clock)
        assert await n.manager.expire_once() == 0
    assert h.manager.keeper.beats == {VM}
    store.down, n.leads = False, True  # promoted; N wins the lock before H's keeper is back
    assert await n.manager.expire_once() == 0  # the last stored heartbeat is 6 s old
    assert n.alive()

    await h.manager.keeper.recover()  # H's keeper comes back: its heartbeats reach the store
    for _ in range(4):
        await beat(h, clock)
        assert await n.manager.expire_once() == 0
    assert n.alive()
    assert h.alive()

    clock.now += TTL + 1  # the heartbeats really stop: N judges, one TTL after the last
    assert await n.manager.expire_once() == 1
    assert not n.alive()


async def test_heartbeats_reach_the_store_while_whole_records_are_refused(
    steady: tuple[Replica, Replica], store: FailingOver, clock: Clock, make_workload: MakeWorkload
) -> None:
    h, n = steady
    h.leads, n.leads = False, True
    await n.manager.expire_once()  # N took over while all was well
    store.unreplicated = True  # a new master without its replica: records wait for one
    probe = make_workload("probe-1", services=("bookstore-v1",), namespace="bookstore")
    with pytest.raises(StoreUnavailable, match="NOREPLICAS"):
        await h.manager.register(probe)
    for _ in range(3 * int(TTL)):  # 3 TTLs of a registration that cannot be written
        await beat(h, clock)
        assert await n.manager.expire_once() == 0
    assert "bookstore/probe-1" in h.manager.keeper.rewrites
    assert store.heartbeat_times[VM] == clock.now
    assert n.alive()


async def test_the_leader_reads_a_revival_it_missed_back_from_the_store(
    steady: tuple[Replica, Replica], store: FailingOver, clock: Clock
) -> None:
    h, n = steady
    h.leads, n.leads = False, True
    await n.manager.expire_once()
    clock.now += TTL + 1  # silent for a TTL: N judges it dead, and H hears that
    assert await n.manager.expire_once() == 1
    await h.manager.verdict(VM, alive=False)
    assert not n.alive()
    assert not h.alive()

    await beat(h, clock)  # back, at H; H's REVIVED signal is lost on its way to N
    assert h.alive()
    assert not n.alive()
    clock.now += DEAD_RECHECK_SECONDS
    assert await n.manager.expire_once() == 1  # read back from the store: revived at N
    assert n.alive()
