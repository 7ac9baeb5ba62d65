"""The endpoints manager: store writes, ordered revisions, watchers, expiry, metrics.

It runs on the in-memory store, a fake clock and an ``announce`` that numbers revisions
1, 2, 3... like the bus, so every revision and timestamp below is known in advance.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from trellis_common.fanout import DEFAULT_QUEUE, Subscription, WatchOverflow
from trellis_common.health import Rejections
from trellis_endpoints_vm.domain.declarations import DeclaredEndpoint, DeclaredEntry
from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import InvalidWorkload, Workload
from trellis_endpoints_vm.manager import (
    EndpointsManager,
    StoreUnavailable,
    UnknownWorkload,
    ViewChange,
)
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.store import Rejected
from trellis_endpoints_vm.testing import InMemoryWorkloadStore

MakeWorkload = Callable[..., Workload]
Parse = Callable[[str], tuple[list[DeclaredEntry], list[DeclaredEndpoint]]]

NOW = 1_000.0
API = ServiceKey("shop", "api")
WEB = ServiceKey("shop", "web")


class FakeClock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Bell:
    """Records what the manager announces and numbers revisions like the bus; can fail."""

    def __init__(self) -> None:
        self.rung: list[tuple[str, str]] = []
        self.failing = False

    async def __call__(self, kind: str, key: str) -> int:
        if self.failing:
            raise ConnectionError("the bus is down")
        self.rung.append((kind, key))
        return len(self.rung)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def bell() -> Bell:
    return Bell()


@pytest.fixture
async def manager(
    store: InMemoryWorkloadStore, bell: Bell, clock: FakeClock, metrics: EndpointMetrics
) -> EndpointsManager:
    manager = EndpointsManager(store, bell, metrics, clock=clock)
    await manager.start()
    return manager


Seen = tuple[int, str, list[str] | None]


def seen(change: ViewChange) -> Seen:
    """(revision, "namespace/service", endpoint addresses or None when removed)."""
    view = change.view
    return (
        change.revision,
        str(change.key),
        None if view is None else [e.address for e in view.endpoints],
    )


async def take(changes: Subscription[ViewChange], count: int) -> list[Seen]:
    return [seen(await asyncio.wait_for(anext(changes), 1.0)) for _ in range(count)]


async def assert_nothing_more(changes: Subscription[ViewChange]) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(changes), 0.01)


async def drain(changes: Subscription[ViewChange], into: list[ViewChange]) -> None:
    async for change in changes:
        into.append(change)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(f"trellis_endpoints_vm_{name}", labels)


# --- registrations write the store ---------------------------------------------------------


async def test_register_heartbeat_deregister_write_the_store(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    clock: FakeClock,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    registered = await manager.register(make_workload(ttl=30.0))
    assert (registered.registered_at, registered.last_heartbeat) == (NOW, NOW)
    assert store.workloads == {"shop/vm-1": registered}
    assert sample(metrics_registry, "registrations_total") == 1.0

    clock.now = NOW + 5
    beaten = await manager.heartbeat("shop/vm-1")
    assert (beaten.registered_at, beaten.last_heartbeat) == (NOW, NOW + 5)
    assert await manager.keeper.write_behind()  # what the keeper's loop does at once
    assert store.workloads == {"shop/vm-1": beaten}
    assert manager.registry.workloads["shop/vm-1"] == beaten
    assert manager.workloads() == [(beaten, True)]

    await manager.deregister("shop/vm-1")
    assert store.workloads == {}
    assert manager.views() == []
    assert manager.workloads() == []


async def test_register_again_keeps_registered_at(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    clock: FakeClock,
    make_workload: MakeWorkload,
) -> None:
    await manager.register(make_workload(address="10.0.0.1"))
    clock.now = NOW + 100
    again = await manager.register(make_workload(address="10.0.0.2", registered_at=5.0))
    assert (again.registered_at, again.last_heartbeat) == (NOW, NOW + 100)
    assert store.workloads["shop/vm-1"] == again
    view = manager.view(API)
    assert view is not None
    assert [e.address for e in view.endpoints] == ["10.0.0.2"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"address": "vm-1.example.com"}, "address"),
        ({"ports": (("http", 0),)}, "ports[http]"),
        ({"services": ()}, "services"),
        ({"ttl": 0.1}, "ttl"),
    ],
)
async def test_an_invalid_workload_changes_nothing(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    bell: Bell,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
    fields: dict[str, object],
    field: str,
) -> None:
    await manager.register(make_workload())  # the same id, valid
    changes = manager.watch()
    stored, views, revision = dict(store.workloads), manager.views(), manager.revision

    with pytest.raises(InvalidWorkload) as caught:
        await manager.register(make_workload(**fields))
    assert caught.value.field == field
    assert store.workloads == stored
    assert manager.views() == views
    assert manager.revision == revision
    assert bell.rung == [("changed", "shop/api")]
    assert sample(metrics_registry, "registrations_total") == 1.0
    await assert_nothing_more(changes)


@pytest.mark.parametrize("operation", ["heartbeat", "deregister"])
async def test_unknown_workloads_raise_and_change_nothing(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    bell: Bell,
    make_workload: MakeWorkload,
    operation: str,
) -> None:
    await manager.register(make_workload())
    stored = dict(store.workloads)
    with pytest.raises(UnknownWorkload):
        await getattr(manager, operation)("shop/vm-2")
    assert store.workloads == stored
    assert len(bell.rung) == 1


# --- revisions and watchers ----------------------------------------------------------------


async def test_watchers_see_each_change_once_in_revision_order(
    manager: EndpointsManager, bell: Bell, make_workload: MakeWorkload
) -> None:
    first, second = manager.watch(), manager.watch()
    await manager.register(make_workload("vm-1", services=("api",), address="10.0.0.1"))
    await manager.register(make_workload("vm-2", services=("api",), address="10.0.0.2"))
    await manager.register(make_workload("vm-3", services=("web",), address="10.0.0.3"))
    await manager.deregister("shop/vm-1")
    await manager.heartbeat("shop/vm-2")  # alive already: no change

    expected = [
        (1, "shop/api", ["10.0.0.1"]),
        (2, "shop/api", ["10.0.0.1", "10.0.0.2"]),
        (3, "shop/web", ["10.0.0.3"]),
        (4, "shop/api", ["10.0.0.2"]),
    ]
    for changes in (first, second):
        assert await take(changes, 4) == expected
        await assert_nothing_more(changes)
    assert manager.revision == 4
    assert bell.rung == [("changed", str(key)) for key in (API, API, WEB, API)]

    await manager.deregister("shop/vm-3")
    assert await take(first, 1) == [(5, "shop/web", None)]
    assert bell.rung[-1] == ("removed", "shop/web")
    await first.aclose()
    await second.aclose()


async def test_a_watcher_sees_what_happens_after_it_subscribed(
    manager: EndpointsManager, make_workload: MakeWorkload
) -> None:
    await manager.register(make_workload("vm-1", address="10.0.0.1"))
    changes = manager.watch()
    await manager.register(make_workload("vm-2", address="10.0.0.2"))
    assert await take(changes, 1) == [(2, "shop/api", ["10.0.0.1", "10.0.0.2"])]
    await assert_nothing_more(changes)


async def test_a_failing_announce_still_reaches_watchers(
    manager: EndpointsManager,
    bell: Bell,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    changes = manager.watch()
    await manager.register(make_workload("vm-1", address="10.0.0.1"))
    bell.failing = True
    with caplog.at_level(logging.WARNING):
        await manager.register(make_workload("vm-2", address="10.0.0.2"))
    assert await take(changes, 2) == [
        (1, "shop/api", ["10.0.0.1"]),
        (2, "shop/api", ["10.0.0.1", "10.0.0.2"]),
    ]
    assert manager.revision == 2
    assert sample(metrics_registry, "service_changes_total") == 2.0
    assert "endpoints.announce_failed service=shop/api" in caplog.text


async def test_a_slow_watcher_is_ended_with_overflow(
    manager: EndpointsManager,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    slow = manager.watch()
    assert sample(metrics_registry, "watchers") == 1.0
    published = DEFAULT_QUEUE + 1
    for i in range(published):  # each registration moves the workload: one change each
        await manager.register(make_workload(address=f"10.0.0.{i % 2 + 1}"))
    assert manager.revision == published
    assert sample(metrics_registry, "watchers") == 0.0  # ended, not waited for

    received: list[ViewChange] = []
    with pytest.raises(WatchOverflow):
        await drain(slow, received)
    assert len(received) < published

    fresh = manager.watch()  # watching again works
    await manager.register(make_workload(address="10.0.0.9"))
    assert await take(fresh, 1) == [(published + 1, "shop/api", ["10.0.0.9"])]
    await fresh.aclose()
    assert sample(metrics_registry, "watchers") == 0.0


# --- expiry --------------------------------------------------------------------------------


async def test_expire_once_takes_out_expired_workloads(
    manager: EndpointsManager,
    clock: FakeClock,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    changes = manager.watch()
    await manager.register(make_workload(ttl=10.0))
    clock.now = NOW + 9
    assert await manager.expire_once() == 0
    clock.now = NOW + 10
    assert await manager.expire_once() == 1
    assert sample(metrics_registry, "expirations_total") == 1.0
    assert manager.workloads()[0][1] is False

    clock.now = NOW + 11
    await manager.heartbeat("shop/vm-1")
    assert await take(changes, 3) == [
        (1, "shop/api", ["10.0.0.1"]),
        (2, "shop/api", []),
        (3, "shop/api", ["10.0.0.1"]),
    ]
    assert sample(metrics_registry, "expirations_total") == 1.0


async def test_run_expiry_expires_until_stopped(
    manager: EndpointsManager, clock: FakeClock, make_workload: MakeWorkload
) -> None:
    changes = manager.watch()
    await manager.register(make_workload(ttl=10.0))
    clock.now = NOW + 10
    stop = asyncio.Event()
    task = asyncio.create_task(manager.run_expiry(stop, interval=0.01))
    assert await take(changes, 2) == [(1, "shop/api", ["10.0.0.1"]), (2, "shop/api", [])]
    stop.set()
    await asyncio.wait_for(task, 1.0)


# --- start and declarations ----------------------------------------------------------------


async def test_start_loads_the_store_without_announcing(
    store: InMemoryWorkloadStore,
    bell: Bell,
    clock: FakeClock,
    metrics: EndpointMetrics,
    make_workload: MakeWorkload,
) -> None:
    alive = make_workload("vm-1", address="10.0.0.1", registered_at=1.0, last_heartbeat=1.0)
    stale = make_workload(
        "vm-2", address="10.0.0.2", ttl=10.0, registered_at=1.0, last_heartbeat=NOW - 60
    )
    await store.put(alive)
    await store.put(stale)
    manager = EndpointsManager(store, bell, metrics, clock=clock)
    changes = manager.watch()
    assert not manager.ready.is_set()

    await manager.start(revision=41)
    assert manager.ready.is_set()
    assert manager.revision == 41
    assert bell.rung == []
    await assert_nothing_more(changes)
    assert manager.workloads() == [(alive, True), (stale, False)]
    view = manager.view(API)
    assert view is not None
    assert [e.address for e in view.endpoints] == ["10.0.0.1"]

    await manager.heartbeat("shop/vm-2")  # back from the dead
    # the bell answers 1, but a revision never goes back below where the manager started
    assert await take(changes, 1) == [(42, "shop/api", ["10.0.0.1", "10.0.0.2"])]


async def test_declare_emits_changes_and_returns_conflicts(
    manager: EndpointsManager, declarations: Parse
) -> None:
    entry = """apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: {name}, namespace: shop}}
spec:
  hosts: [ext.example.com]
  ports: [{{number: 443, name: https, protocol: TLS}}]
  resolution: DNS
"""
    changes = manager.watch()
    conflicts = await manager.declare(
        *declarations(entry.format(name="a") + "---\n" + entry.format(name="b"))
    )
    assert len(conflicts) == 1
    assert "shop/b" in conflicts[0]
    assert await take(changes, 1) == [(1, "shop/ext.example.com", ["ext.example.com"])]
    assert [v.key for v in manager.views("shop")] == [ServiceKey("shop", "ext.example.com")]
    assert manager.views("bank") == []

    assert await manager.declare([], []) == []
    assert await take(changes, 1) == [(2, "shop/ext.example.com", None)]


# --- gauges --------------------------------------------------------------------------------


async def test_gauges_read_the_current_state(
    manager: EndpointsManager,
    clock: FakeClock,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    def gauges() -> tuple[float | None, ...]:
        return (
            sample(metrics_registry, "workloads", state="alive"),
            sample(metrics_registry, "workloads", state="expired"),
            sample(metrics_registry, "services"),
            sample(metrics_registry, "endpoints"),
        )

    assert gauges() == (0.0, 0.0, 0.0, 0.0)
    await manager.register(make_workload("vm-1", services=("api",), ttl=10.0))
    await manager.register(make_workload("vm-2", services=("api", "web"), address="10.0.0.2"))
    assert gauges() == (2.0, 0.0, 2.0, 3.0)

    clock.now = NOW + 10  # liveness is read when scraped; views change on expiry
    assert gauges() == (1.0, 1.0, 2.0, 3.0)
    await manager.expire_once()
    assert gauges() == (1.0, 1.0, 2.0, 2.0)

    await manager.deregister("shop/vm-1")
    await manager.deregister("shop/vm-2")
    assert gauges() == (0.0, 0.0, 0.0, 0.0)


async def test_the_watchers_gauge_counts_open_watches(
    manager: EndpointsManager, metrics_registry: CollectorRegistry
) -> None:
    assert sample(metrics_registry, "watchers") == 0.0
    async with manager.watch():
        second = manager.watch()
        assert sample(metrics_registry, "watchers") == 2.0
        await second.aclose()
        assert sample(metrics_registry, "watchers") == 1.0
    assert sample(metrics_registry, "watchers") == 0.0


# --- Redis outages: registrations refused, heartbeats counted, nothing expires for it -------


async def test_a_registration_while_the_store_is_down_is_refused_and_changes_nothing(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    bell: Bell,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    await manager.register(make_workload("vm-1"))
    views, revision = manager.views(), manager.revision
    store.down = True

    with pytest.raises(StoreUnavailable, match="Redis is unavailable") as caught:
        await manager.register(make_workload("vm-2", address="10.0.0.2"))
    assert "nothing was stored" in str(caught.value)
    assert not manager.keeper.available
    writes = store.writes
    with pytest.raises(StoreUnavailable):  # known down: refused at once, Redis not tried
        await manager.deregister("shop/vm-1")
    assert store.writes == writes
    assert manager.views() == views
    assert manager.revision == revision
    assert list(manager.registry.workloads) == ["shop/vm-1"]
    assert len(bell.rung) == 1
    assert sample(metrics_registry, "store_refusals_total", operation="register") == 1.0
    assert sample(metrics_registry, "store_refusals_total", operation="deregister") == 1.0
    assert sample(metrics_registry, "store_available") == 0.0


async def test_heartbeats_while_the_store_is_down_count_and_are_written_when_it_is_back(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    clock: FakeClock,
    make_workload: MakeWorkload,
    metrics_registry: CollectorRegistry,
) -> None:
    await manager.register(make_workload("vm-1", ttl=10.0))
    await manager.register(make_workload("vm-2", address="10.0.0.2", ttl=10.0))
    store.down = True
    clock.now = NOW + 5
    beaten = await manager.heartbeat("shop/vm-1")
    assert not await manager.keeper.write_behind()  # the keeper's loop meets the outage
    assert beaten.last_heartbeat == NOW + 5
    assert manager.keeper.pending == {"shop/vm-1"}
    assert sample(metrics_registry, "store_pending_writes") == 1.0
    assert store.workloads["shop/vm-1"].last_heartbeat == NOW  # not written yet

    # Redis stays away far past the TTL: both stay endpoints, vm-2 never even beat
    clock.now = NOW + 100
    assert await manager.expire_once() == 0
    assert [alive for _, alive in manager.workloads()] == [True, True]

    store.down = False
    assert await manager.keeper.recover() == 1
    assert manager.keeper.available
    assert store.workloads["shop/vm-1"].last_heartbeat == NOW + 5
    # one TTL of grace from the recovery, then the usual rule
    clock.now = NOW + 109.9
    assert await manager.expire_once() == 0
    clock.now = NOW + 110
    assert await manager.expire_once() == 1
    view = manager.view(API)
    assert view is not None
    assert view.endpoints == ()


async def test_a_store_that_lost_its_data_gets_every_registration_back(
    manager: EndpointsManager, store: InMemoryWorkloadStore, make_workload: MakeWorkload
) -> None:
    first = await manager.register(make_workload("vm-1"))
    second = await manager.register(make_workload("vm-2", address="10.0.0.2"))
    assert await manager.keeper.refill_if_lost() == 0
    store.workloads.clear()  # Redis came back empty
    assert await manager.keeper.refill_if_lost() == 2
    assert store.workloads == {"shop/vm-1": first, "shop/vm-2": second}


async def test_changes_while_the_store_is_down_reach_watchers_without_ringing_the_bus(
    manager: EndpointsManager,
    store: InMemoryWorkloadStore,
    bell: Bell,
    clock: FakeClock,
    make_workload: MakeWorkload,
) -> None:
    await manager.register(make_workload(ttl=10.0))
    clock.now = NOW + 10
    await manager.expire_once()
    changes = manager.watch()
    store.down = True
    with pytest.raises(StoreUnavailable):  # a write meets the outage: the store is down
        await manager.keeper.put(make_workload("vm-9"))
    await manager.heartbeat("shop/vm-1")  # a revival: a change, while Redis is away
    assert await take(changes, 1) == [(3, "shop/api", ["10.0.0.1"])]
    assert len(bell.rung) == 2


async def test_records_refused_at_load_are_reported_until_overwritten_or_deleted(
    store: InMemoryWorkloadStore,
    bell: Bell,
    clock: FakeClock,
    metrics: EndpointMetrics,
    make_workload: MakeWorkload,
) -> None:
    store.rejected = [
        Rejected("shop/vm-1", "wl[shop/vm-1]", "malformed workload record: truncated"),
        Rejected("shop/vm-2", "wl[shop/vm-2]", "namespace: 'Bad!' is not a valid label"),
    ]
    await store.put(make_workload("vm-3", address="10.0.0.3"))
    rejections = Rejections()
    manager = EndpointsManager(store, bell, metrics, clock=clock, rejections=rejections)
    await manager.start()
    assert [w.id for w, _ in manager.workloads()] == ["shop/vm-3"]  # the rest is served
    assert manager.rejected() == ["shop/vm-1", "shop/vm-2"]
    assert [(r.source, r.key, r.reason) for r in rejections.items()] == [
        ("redis", "wl[shop/vm-1]", "malformed workload record: truncated"),
        ("redis", "wl[shop/vm-2]", "namespace: 'Bad!' is not a valid label"),
    ]

    await manager.register(make_workload("vm-1"))  # overwrites the bad record
    await manager.deregister("shop/vm-2")  # deletes a bad record nobody re-registers
    assert manager.rejected() == []
    assert len(rejections) == 0
    assert store.rejected == []
    assert sorted(store.workloads) == ["shop/vm-1", "shop/vm-3"]
    with pytest.raises(UnknownWorkload):
        await manager.deregister("shop/vm-2")
