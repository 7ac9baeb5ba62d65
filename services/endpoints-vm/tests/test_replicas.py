"""Two replicas of endpoints-vm on one real Redis, as ``trellis up --replicas
endpoints-vm=2`` and the chart run them: each signals its changes through a real Outbox
and follows the other's through a real Signals hub, as ``main`` wires them, logged in as
endpoints-vm's own Redis user. One clock for both; ``leads`` says which one judges TTLs.

What must hold: either replica takes registrations and heartbeats and both answer the
same; the TTL is judged once, by the leader, counting heartbeats the other heard; a
heartbeat never puts back a registration that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_common.changefeed import Watch
from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import MIRROR, EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.mirroring import Peers
from trellis_endpoints_vm.replicas import WorkloadFollower
from trellis_endpoints_vm.store import RedisWorkloadStore
from trellis_runtime.events import Outbox, Signals
from trellis_runtime.health import Health
from trellis_runtime.signaling import Publisher
from trellis_runtime.subscriber import redis_without_retries
from trellis_testing import RedisServer, eventually

MakeWorkload = Callable[..., Workload]
API = ServiceKey("shop", "api")
TTL = 10.0


@dataclass
class Clock:
    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Replica:
    name: str
    manager: EndpointsManager
    health: Health
    leads: list[bool] = field(default_factory=lambda: [False])
    watches: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    peers: Peers | None = None
    metrics: CollectorRegistry = field(default_factory=CollectorRegistry)

    def skipped(self) -> float:
        """Changes it did not signal: it thought itself alone."""
        found = self.metrics.get_sample_value("trellis_endpoints_vm_replica_signals_skipped_total")
        return found or 0.0

    def pushed(self) -> Watch[ServiceKey]:
        """A watch of this replica's changes (what the catalog's WatchServices hears)."""
        return self.watches.enter_context(self.manager.feed.watch())

    def leading(self) -> bool:
        return self.leads[0]

    def addresses(self) -> list[str] | None:
        view = self.manager.view(API)
        return None if view is None else [e.address for e in view.endpoints]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@dataclass
class Started:
    """Replicas made by :func:`start`, and what stops them."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    made: list[Replica] = field(default_factory=list)
    clients: list[redis.asyncio.Redis] = field(default_factory=list)

    async def close(self) -> None:
        # signals still on their way (a manager sends them in the background) go out
        # first: one left running would open a connection of the pool closed below, and
        # leave it to the garbage collector, in whichever test runs next
        for replica in self.made:
            await asyncio.wait_for(replica.manager.signalled(), 10)
        self.stop.set()
        await asyncio.gather(*self.tasks)
        for replica in self.made:
            replica.watches.close()
        for client in self.clients:
            await client.aclose()


async def start(
    started: Started,
    name: str,
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    clock: Clock,
    lookup: Callable[[], Awaitable[list[str]]] | None = None,
) -> Replica:
    """One replica as ``main`` wires it; with ``lookup`` (the registry's answer) it keeps
    its :class:`Peers`, and signals nothing while alone."""
    health = Health()
    client = redis_without_retries(redis_server.target("endpoints-vm"), socket_timeout=1.0)
    started.clients.append(client)
    outbox = Outbox(Publisher(client, sender=name), health)

    async def notify(kind: str, workload_id: str) -> int:
        return await outbox.signal(MIRROR, kind, workload_id)

    peers = None if lookup is None else Peers(name, lookup, notify)
    replica = Replica(name, None, health, peers=peers)  # type: ignore[arg-type]  # just below
    replica.manager = EndpointsManager(
        RedisWorkloadStore(redis_client),
        EndpointMetrics(replica.metrics),
        clock=clock,
        notify=notify,
        leading=replica.leading,
        alone=peers.alone if peers is not None else lambda: False,
    )
    await replica.manager.start()
    hub = Signals(redis_server.target("endpoints-vm"), health, client="endpoints-vm")
    follower = hub.follow(WorkloadFollower(replica.manager, name, peers))
    started.tasks += [
        asyncio.create_task(hub.run(started.stop)),
        asyncio.create_task(outbox.run(started.stop)),
    ]
    await asyncio.wait_for(follower.synced.wait(), 10)
    started.made.append(replica)
    return replica


@pytest.fixture
async def replicas(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis, clock: Clock
) -> AsyncIterator[tuple[Replica, Replica]]:
    started = Started()
    try:
        for name in ("endpoints-vm", "endpoints-vm-2"):
            await start(started, name, redis_server, redis_client, clock)
        started.made[0].leads[0] = True
        yield started.made[0], started.made[1]
    finally:
        await started.close()


@pytest.fixture
def vm(make_workload: MakeWorkload) -> Workload:
    return make_workload("vm-1", services=("api",), address="10.0.0.1", ttl=TTL)


async def settled(*replicas: Replica) -> None:
    for replica in replicas:
        await replica.manager.signalled()


async def test_a_registration_at_either_replica_is_served_by_both(
    replicas: tuple[Replica, Replica], make_workload: MakeWorkload, vm: Workload
) -> None:
    leader, standby = replicas
    heard = standby.pushed()
    await leader.manager.register(vm)
    await eventually(lambda: standby.addresses() == ["10.0.0.1"])
    # the standby pushes its own view's change to its watches too: whichever replica the
    # catalog watches answers the same once the replicas' signals have passed
    assert heard.take() == [API]
    await standby.manager.register(make_workload("vm-2", services=("api",), address="10.0.0.2"))
    await eventually(lambda: leader.addresses() == ["10.0.0.1", "10.0.0.2"])

    await standby.manager.deregister("shop/vm-1")
    await eventually(lambda: leader.addresses() == ["10.0.0.2"])
    assert leader.manager.workload("shop/vm-1") is None


async def test_heartbeats_heard_by_the_standby_keep_a_workload_alive_at_the_leader(
    replicas: tuple[Replica, Replica], clock: Clock, vm: Workload
) -> None:
    leader, standby = replicas
    await leader.manager.register(vm)
    await eventually(lambda: standby.addresses() == ["10.0.0.1"])
    for _ in range(3):  # 3 TTLs of heartbeats, every one of them to the standby
        clock.now += TTL * 0.8
        await standby.manager.heartbeat("shop/vm-1")
        await standby.manager.keeper.flush()  # written behind at once while Redis is up
        assert await leader.manager.expire_once() == 0
        assert await standby.manager.expire_once() == 0  # a standby never judges
    assert leader.addresses() == standby.addresses() == ["10.0.0.1"]

    clock.now += TTL + 1  # the heartbeats stop: the leader judges, once, and the standby
    assert await standby.manager.expire_once() == 0  # takes its verdict
    assert await leader.manager.expire_once() == 1
    assert leader.addresses() == []
    await eventually(lambda: standby.addresses() == [])

    await standby.manager.heartbeat("shop/vm-1")  # back, heard by the standby
    assert standby.addresses() == ["10.0.0.1"]
    await eventually(lambda: leader.addresses() == ["10.0.0.1"])
    await standby.manager.keeper.flush()
    clock.now += TTL / 2
    assert await leader.manager.expire_once() == 0  # the revival counts at the leader


async def test_leadership_moves_and_the_new_leader_judges(
    replicas: tuple[Replica, Replica], clock: Clock, vm: Workload
) -> None:
    leader, standby = replicas
    await leader.manager.register(vm)
    await eventually(lambda: standby.addresses() == ["10.0.0.1"])
    leader.leads[0], standby.leads[0] = False, True  # the leader died; the standby took over
    clock.now += TTL + 1
    assert await leader.manager.expire_once() == 0
    assert await standby.manager.expire_once() == 1
    await eventually(lambda: leader.addresses() == [])


async def test_a_heartbeat_never_puts_back_a_deregistered_workload(
    replicas: tuple[Replica, Replica],
    redis_client: redis.asyncio.Redis,
    vm: Workload,
) -> None:
    leader, standby = replicas
    await leader.manager.register(vm)
    await eventually(lambda: standby.addresses() == ["10.0.0.1"])
    store = RedisWorkloadStore(redis_client)
    # the standby heard a heartbeat just before the leader deregistered the workload, and
    # writes it behind just after: the registration stays gone
    await standby.manager.heartbeat("shop/vm-1")
    await leader.manager.deregister("shop/vm-1")
    await standby.manager.keeper.flush()
    assert await store.load(["shop/vm-1"]) == {"shop/vm-1": None}
    assert (await store.load_all()).records == []
    await eventually(lambda: standby.manager.workload("shop/vm-1") is None)
    assert await store.prune(tombstone_age=3600) in (0, 1)  # an orphan heartbeat, if any
    assert await redis_client.hlen(store.heartbeat_key) == 0
    assert await store.deregistered(["shop/vm-1"]) == {"shop/vm-1"}  # young: kept
    assert await store.prune(tombstone_age=0) == 1
    assert await store.deregistered(["shop/vm-1"]) == set()


async def test_a_replica_that_missed_signals_catches_up_from_the_store(
    replicas: tuple[Replica, Replica],
    redis_client: redis.asyncio.Redis,
    make_workload: MakeWorkload,
    vm: Workload,
) -> None:
    leader, standby = replicas
    await leader.manager.register(vm)
    await eventually(lambda: standby.addresses() == ["10.0.0.1"])
    # as if its subscription had been down: the store changes behind its back
    store = RedisWorkloadStore(redis_client)
    await store.write([make_workload("vm-3", services=("api",), address="10.0.0.3")], ["shop/vm-1"])
    assert standby.addresses() == ["10.0.0.1"]
    assert await standby.manager.mirror_all() > 0  # views changed, and were signalled
    assert standby.addresses() == ["10.0.0.3"]


async def test_a_store_that_lost_its_data_is_not_a_deregistration(
    replicas: tuple[Replica, Replica],
    redis_client: redis.asyncio.Redis,
    vm: Workload,
) -> None:
    """Redis came back empty (no persistence, a failover to a stale replica): a replica
    that reads the store back keeps what it holds, and the leader writes it back."""
    leader, standby = replicas
    await leader.manager.register(vm)
    await eventually(lambda: standby.addresses() == ["10.0.0.1"])
    store = RedisWorkloadStore(redis_client)
    await redis_client.delete(store.key, store.heartbeat_key, store.tombstone_key)
    assert await standby.manager.mirror_all() == 0  # no tombstone: lost, not deregistered
    assert standby.addresses() == ["10.0.0.1"]
    assert await standby.manager.keeper.refill_if_lost() == 0  # a standby does not refill
    assert await leader.manager.keeper.refill_if_lost() == 1
    assert [w.id for w in (await store.load_all()).records] == ["shop/vm-1"]


@dataclass
class Lonely:
    """The first replica alone as far as it knows, the second running beside it."""

    first: Replica
    second: Replica
    listed: list[str]  # what the registry answers the first


@pytest.fixture
async def lonely(
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    clock: Clock,
    make_workload: MakeWorkload,
    vm: Workload,
) -> AsyncIterator[Lonely]:
    """The first replica never heard the second (which started before it listened, and
    keeps no peers of its own: it never welcomes the first) and the registry lists
    neither: the first registers ``vm`` alone, unsignalled."""
    started = Started()
    listed: list[str] = []

    async def lookup() -> list[str]:
        return list(listed)

    try:
        second = await start(started, "endpoints-vm-2", redis_server, redis_client, clock)
        first = await start(started, "endpoints-vm", redis_server, redis_client, clock, lookup)
        first.leads[0] = True
        assert first.peers is not None
        await first.peers.refresh()
        assert first.peers.alone()
        await first.manager.register(vm)
        await first.manager.signalled()
        assert first.skipped() == 1
        assert second.addresses() is None  # nothing told it
        yield Lonely(first, second, listed)
    finally:
        await started.close()


async def test_a_newcomer_a_lone_replica_hears_reads_back_what_it_missed(
    lonely: Lonely, make_workload: MakeWorkload
) -> None:
    """The second's next signal is how the first finds it: it says ``joined``, and the
    second reads the store back (the first's registration there, written before its
    answer); from then on the first signals its changes."""
    first, second = lonely.first, lonely.second
    assert first.peers is not None
    await second.manager.register(make_workload("vm-2", services=("api",), address="10.0.0.2"))
    await eventually(lambda: first.addresses() == ["10.0.0.1", "10.0.0.2"])
    assert first.peers.others == ["endpoints-vm-2"]
    await eventually(lambda: second.addresses() == ["10.0.0.1", "10.0.0.2"])

    await first.manager.deregister("shop/vm-1")
    await eventually(lambda: second.addresses() == ["10.0.0.2"])
    assert first.skipped() == 1


async def test_a_replica_found_in_the_registry_is_welcomed(lonely: Lonely) -> None:
    """A replica the first did not hear is found at its next lookup of the registry, and
    reads back what it missed."""
    first = lonely.first
    assert first.peers is not None
    lonely.listed[:] = ["endpoints-vm", "endpoints-vm-2"]
    await first.peers.refresh()
    assert first.peers.welcomed == 1
    await eventually(lambda: lonely.second.addresses() == ["10.0.0.1"])
