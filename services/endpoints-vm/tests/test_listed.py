"""A registered service's view moved in parts is the view computed from every member.

Random sequences of registrations, moves between services and addresses, removals,
heartbeats, verdicts and expiry; after each step, every service's view (and the changes
reported) must be what a computation from scratch gives: the counted members' endpoints,
sorted and without repeats, and each port name numbered by the first member by id.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trellis_common.memo import sorted_unique
from trellis_endpoints_vm.domain.registry import EndpointRegistry
from trellis_endpoints_vm.domain.views import PortInfo, ServiceInfo, ServiceKey, ServiceView
from trellis_endpoints_vm.domain.workloads import Workload

SERVICES = ("api", "web", "db")
PORTS = (
    (("http", 80),),
    (("http", 8080),),
    (("http", 80), ("grpc", 9090)),
    (("grpc", 9090),),
    (("grpc", 9091), ("grpc", 9092)),  # one name twice: the first counts
)


def registered_ports(members: list[Workload]) -> tuple[PortInfo, ...]:
    """Each port name with the number the first member (by id) gives it."""
    ports: dict[str, int] = {}
    for workload in members:
        for name, number in workload.ports:
            ports.setdefault(name, number)
    return tuple(PortInfo(name, number) for name, number in sorted(ports.items()))


def from_scratch(registry: EndpointRegistry, key: ServiceKey, now: float) -> ServiceView | None:
    members = registry.members(key)
    if not members:
        return None
    counted = [w.endpoint() for w in members if registry.counted(w, now)]
    return ServiceView(
        ServiceInfo(key=key, ports=registered_ports(members)), sorted_unique(counted)
    )


workloads = st.builds(
    lambda index, services, address, ports, weight, ttl: Workload(
        namespace="shop",
        name=f"w{index}",
        services=tuple(services),
        address=f"10.0.0.{address}",
        ports=ports,
        weight=weight,
        ttl=ttl,
    ),
    index=st.integers(0, 7),
    services=st.lists(st.sampled_from(SERVICES), min_size=1, max_size=2, unique=True),
    address=st.integers(1, 4),
    ports=st.sampled_from(PORTS),
    weight=st.integers(1, 2),
    ttl=st.sampled_from([None, 10.0]),
)
steps = st.one_of(
    st.tuples(st.just("upsert"), workloads),
    st.tuples(st.just("remove"), st.integers(0, 7)),
    st.tuples(st.just("heartbeat"), st.integers(0, 7)),
    st.tuples(st.just("judge"), st.integers(0, 7), st.booleans()),
    st.tuples(st.just("expire"), st.floats(0, 30)),
    st.tuples(st.just("adopt"), st.integers(0, 7)),  # heard by another replica
    st.tuples(st.just("restarted"), st.floats(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(steps, max_size=40))
def test_views_moved_in_parts_are_the_views_from_scratch(script: list[tuple[Any, ...]]) -> None:
    registry = EndpointRegistry()
    now = 1000.0
    for step in script:
        before = dict(registry.views)
        kind = step[0]
        if kind == "upsert":
            changes = registry.upsert(step[1], now)
        elif kind == "expire":
            now += step[1]
            changes, _ = registry.expire(now)
        elif kind == "restarted":
            now += step[1]
            _, changes = registry.restarted(now)
        elif f"shop/w{step[1]}" not in registry.workloads:
            continue
        elif kind == "remove":
            changes = registry.remove(f"shop/w{step[1]}", now)
        elif kind == "heartbeat":
            _, changes = registry.heartbeat(f"shop/w{step[1]}", now)
        elif kind == "adopt":  # a verdict moves only at the next expire
            registry.adopt(f"shop/w{step[1]}", now)
            changes = []
        else:
            changes = registry.judge(f"shop/w{step[1]}", step[2], now)
        for name in SERVICES:
            key = ServiceKey("shop", name)
            assert registry.views.get(key) == from_scratch(registry, key, now), (step, key)
        moved = {c.key: c.view for c in changes}
        assert moved == {
            k: registry.views.get(k)
            for k in set(before) | set(registry.views)
            if before.get(k) != registry.views.get(k)
        }


def test_an_unchanged_endpoint_keeps_its_identity_and_a_moved_one_is_new() -> None:
    registry = EndpointRegistry()
    key = ServiceKey("shop", "api")
    for i in range(50):
        registry.upsert(
            Workload("shop", f"w{i}", ("api",), f"10.0.1.{i}", (("http", 80),), ttl=10.0), 0.0
        )
    before = registry.views[key].endpoints
    # registered again: a new workload object, the same endpoint
    registry.upsert(Workload("shop", "w7", ("api",), "10.0.1.7", (("http", 80),), ttl=10.0), 1.0)
    registry.upsert(Workload("shop", "w9", ("api",), "10.0.2.9", (("http", 80),)), 1.0)
    after = registry.views[key].endpoints
    assert len(after) == 50
    same = {e.workload: e for e in before}
    moved = [e for e in after if same[e.workload] is not e]
    assert [e.workload for e in moved] == ["shop/w9"]
    assert after == from_scratch(registry, key, 1.0).endpoints  # type: ignore[union-attr]


def test_a_workload_expire_brings_back_is_counted_again() -> None:
    """Another replica heard it (adopted): the next judgement revives it in the view."""
    registry = EndpointRegistry()
    key = ServiceKey("shop", "api")
    for i in range(3):
        registry.upsert(
            Workload("shop", f"w{i}", ("api",), f"10.0.0.{i}", (("http", 80),), ttl=10.0), 0.0
        )
    changes, expired = registry.expire(11.0)
    assert expired == ["shop/w0", "shop/w1", "shop/w2"]
    assert registry.views[key].endpoints == ()
    assert registry.adopt("shop/w1", 12.0)
    changes, expired = registry.expire(13.0)
    assert expired == []
    assert [c.key for c in changes] == [key]
    assert [e.workload for e in registry.views[key].endpoints] == ["shop/w1"]
    assert registry.views[key] == from_scratch(registry, key, 13.0)
