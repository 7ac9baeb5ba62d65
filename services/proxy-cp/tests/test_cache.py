"""The cache: resources serialized once, per-type versions, consistency, set/get/wait."""

from __future__ import annotations

import asyncio
import functools

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.snapshot import (
    EMPTY_VERSION,
    Snapshot,
    encoded_resource,
    make_resource,
    with_nonce,
)
from trellis_proxy_cp.cache.store import InconsistentSnapshot, SnapshotCache
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, TypeUrl

# -- resources -----------------------------------------------------------------------------


def test_resource_is_serialized_once_and_versioned_by_content() -> None:
    message = t.load_assignment("c0", 8080)
    first = make_resource(ENDPOINT, message)
    assert first.name == "c0"  # a ClusterLoadAssignment is named by cluster_name
    assert first.any.type_url == ENDPOINT
    assert first.any.value == message.SerializeToString(deterministic=True)
    assert len(first.version) == 16
    assert make_resource(ENDPOINT, t.load_assignment("c0", 8080)).version == first.version
    assert make_resource(ENDPOINT, t.load_assignment("c0", 8081)).version != first.version


def test_snapshots_built_from_one_resource_share_its_encoding() -> None:
    shared = t.resource(t.secret("cert"))
    one = t.snapshot("1", shared, t.secret("ca"))
    two = t.snapshot("2", shared)
    assert one.of_type(SECRET)["cert"].entry is two.of_type(SECRET)["cert"].entry is shared.entry
    assert one.of_type(SECRET)["cert"].delta_entry is shared.delta_entry  # encoded once


def test_a_resource_made_from_its_bytes_is_the_one_made_from_its_message() -> None:
    message = t.load_assignment("c0", 8080)
    made = make_resource(ENDPOINT, message)
    encoded = encoded_resource(
        ENDPOINT, "c0", message.SerializeToString(deterministic=True), type(message)
    )
    assert (encoded.entry, encoded.version, encoded.any) == (made.entry, made.version, made.any)
    assert encoded.body == message  # parsed when asked for
    assert encoded.body is encoded.body
    delta = discovery_pb2.Resource(name="c0", version=made.version, resource=made.any)
    wrapped = discovery_pb2.DeltaDiscoveryResponse.FromString(encoded.delta_entry)
    assert list(wrapped.resources) == [delta]
    with pytest.raises(ValueError, match="does not match"):
        encoded_resource(CLUSTER, "c0", b"", type(message))
    with pytest.raises(ValueError, match="needs a name"):
        encoded_resource(ENDPOINT, "", b"", type(message))


def test_a_response_is_serialized_once_and_each_stream_adds_its_nonce() -> None:
    snapshot = t.snapshot("1", t.load_assignment("c0", 8080), t.load_assignment("c1", 8081))
    body, count = snapshot.response(ENDPOINT, ("c1", "gone"))
    assert count == 1
    assert snapshot.response(ENDPOINT, ("c1", "gone"))[0] is body  # shared, not rebuilt
    for nonce in ("7", "n" * 200):  # a nonce of 200 bytes: a length of two varint bytes
        parsed = discovery_pb2.DiscoveryResponse.FromString(with_nonce(body, nonce))
        assert parsed == discovery_pb2.DiscoveryResponse(
            version_info=snapshot.version_of(ENDPOINT),
            resources=[snapshot.of_type(ENDPOINT)["c1"].any],
            type_url=ENDPOINT,
            nonce=nonce,
        )
    every, count = snapshot.response(ENDPOINT, None)  # every resource, by name
    assert count == 2
    names = [
        endpoint_pb2.ClusterLoadAssignment.FromString(r.value).cluster_name
        for r in discovery_pb2.DiscoveryResponse.FromString(every).resources
    ]
    assert names == ["c0", "c1"]


def expected_response(
    snapshot: Snapshot, type_url: TypeUrl, names: tuple[str, ...] | None
) -> bytes:
    """What protobuf writes for the response :meth:`Snapshot.response` joins from bytes."""
    available = snapshot.of_type(type_url)
    chosen = sorted(available) if names is None else [n for n in names if n in available]
    response = discovery_pb2.DiscoveryResponse(
        version_info=snapshot.version_of(type_url),
        resources=[available[n].any for n in chosen],
        type_url=type_url,
    )
    return bytes(response.SerializeToString(deterministic=True))


def test_a_response_is_the_bytes_protobuf_writes_for_every_name_or_some() -> None:
    # a secret of 20 kB: lengths of two and three varint bytes
    snapshot = t.snapshot("1", t.cluster("c0"), t.load_assignment("c0", 1),
                          t.secret("big", b"x" * 20_000), t.secret("small"))  # fmt: skip
    for type_url in (CLUSTER, ENDPOINT, SECRET, LISTENER):
        for names in (None, (), ("small",), ("big", "small"), ("c0", "gone")):
            body, count = snapshot.response(type_url, names)
            assert body == expected_response(snapshot, type_url, names), (type_url, names)
            assert count == len(discovery_pb2.DiscoveryResponse.FromString(body).resources)
    body, _ = snapshot.response(SECRET, ("small",))
    assert with_nonce(body, "n1") == discovery_pb2.DiscoveryResponse(
        version_info=snapshot.version_of(SECRET),
        resources=[snapshot.of_type(SECRET)["small"].any],
        type_url=SECRET,
        nonce="n1",
    ).SerializeToString(deterministic=True)


def test_make_resource_refuses_a_wrong_type_url_or_no_name() -> None:
    with pytest.raises(ValueError, match="does not match"):
        make_resource(CLUSTER, t.secret("cert"))
    with pytest.raises(ValueError, match="needs a name"):
        make_resource(SECRET, t.secret(""))


def test_a_snapshot_refuses_duplicate_names() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        t.snapshot("1", t.secret("cert"), t.secret("cert"))


# -- per-type versions ---------------------------------------------------------------------


def test_per_type_versions_change_only_for_changed_types() -> None:
    before = t.mesh("1", ports=(8080,))
    after = t.mesh("2", ports=(8081,))  # only the endpoints differ
    assert after.version_of(ENDPOINT) != before.version_of(ENDPOINT)
    for type_url in (CLUSTER, LISTENER, ROUTE, SECRET):
        assert after.version_of(type_url) == before.version_of(type_url)
    assert before.version_of(TypeUrl("type.googleapis.com/other")) == EMPTY_VERSION
    assert t.snapshot("x").version_of(CLUSTER) == EMPTY_VERSION


def test_a_removed_resource_changes_its_type_version() -> None:
    two = t.snapshot("1", t.secret("a"), t.secret("b"))
    one = t.snapshot("2", t.secret("a"))
    assert one.version_of(SECRET) != two.version_of(SECRET)


def test_type_urls_come_in_push_order() -> None:
    assert t.mesh("1").type_urls() == [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET]


def test_with_type_replaces_one_type_and_shares_the_others() -> None:
    before = t.mesh("1")
    moved = {r.name: r for r in map(t.resource, [t.load_assignment(n, 9090) for n in ("c0", "c1")])}
    before.response(ENDPOINT, None)  # a response of the old one, kept by it

    after = before.with_type(ENDPOINT, moved, "2")

    assert after.version == "2"
    assert dict(after.of_type(ENDPOINT)) == moved
    assert after.version_of(ENDPOINT) == t.mesh("2", ports=(9090,)).version_of(ENDPOINT)
    assert after.version_of(ENDPOINT) != before.version_of(ENDPOINT)
    for type_url in (CLUSTER, LISTENER, ROUTE, SECRET):
        assert after.of_type(type_url) is before.of_type(type_url)
        assert after.version_of(type_url) == before.version_of(type_url)
    assert after.type_urls() == before.type_urls()
    assert after.consistent() == []
    assert after.response(ENDPOINT, None)[0] == expected_response(after, ENDPOINT, None)
    assert before.of_type(ENDPOINT)["c0"].version != moved["c0"].version  # unchanged
    with pytest.raises(TypeError):
        after.resources[ENDPOINT] = {}  # type: ignore[index]


def test_with_type_refuses_other_names() -> None:
    before = t.mesh("1")
    c0 = t.resource(t.load_assignment("c0", 9090))
    c2 = t.resource(t.load_assignment("c2", 9090))

    for names in ({"c0": c0}, {"c0": c0, "c1": c0, "c2": c2}):
        with pytest.raises(ValueError, match="keeps the names"):
            before.with_type(ENDPOINT, names, "2")


def test_with_type_of_no_resources_adds_no_type() -> None:
    before = t.snapshot("1", t.secret("a"))

    assert before.with_type(ENDPOINT, {}, "2").type_urls() == [SECRET]


# -- consistency ---------------------------------------------------------------------------


def test_a_complete_mesh_is_consistent() -> None:
    assert t.mesh("1").consistent() == []


def test_an_eds_cluster_without_its_load_assignment_is_a_problem() -> None:
    problems = t.snapshot("1", t.cluster("c0")).consistent()
    assert problems == ["cluster 'c0' (EDS) has no ClusterLoadAssignment 'c0'"]


def test_the_eds_service_name_is_what_must_exist() -> None:
    named = t.cluster("c0", service_name="svc")
    assert t.snapshot("1", named, t.load_assignment("svc", 1)).consistent() == []
    assert (
        "ClusterLoadAssignment 'svc'"
        in t.snapshot("1", named, t.load_assignment("c0", 1)).consistent()[0]
    )


def test_a_listener_naming_a_missing_route_config_is_a_problem() -> None:
    problems = t.snapshot("1", t.listener("l0", "r0")).consistent()
    assert problems == ["listener 'l0' names missing RouteConfiguration 'r0'"]
    proxyless = t.snapshot("1", t.api_listener("svc:80", "r1")).consistent()
    assert proxyless == ["listener 'svc:80' names missing RouteConfiguration 'r1'"]


def test_missing_secrets_are_problems() -> None:
    problems = t.snapshot(
        "1",
        t.cluster("c0", cert="cert", ca="ca"),
        t.load_assignment("c0", 1),
        t.listener("l0", "r0", cert="server-cert"),
        t.route_config("r0", "c0"),
        t.secret("cert"),
    ).consistent()
    assert problems == [
        "cluster 'c0' names missing secret 'ca'",
        "listener 'l0' names missing secret 'server-cert'",
    ]


# -- the cache -----------------------------------------------------------------------------


def test_set_get_clear_keys() -> None:
    cache = SnapshotCache()
    assert cache.get("a") is None
    snap = t.mesh("1")
    cache.set_snapshot("a", snap)
    assert cache.get("a") is snap
    assert cache.keys() == ["a"]
    cache.clear("a")
    assert cache.get("a") is None
    assert cache.keys() == []


def test_an_inconsistent_snapshot_is_refused_and_the_previous_one_kept() -> None:
    cache = SnapshotCache()
    good = t.mesh("1")
    cache.set_snapshot("a", good)
    with pytest.raises(InconsistentSnapshot) as raised:
        cache.set_snapshot("a", t.snapshot("2", t.cluster("c9")))
    assert raised.value.problems == ["cluster 'c9' (EDS) has no ClusterLoadAssignment 'c9'"]
    assert cache.get("a") is good


async def test_wait_returns_at_once_for_an_unseen_snapshot() -> None:
    cache = SnapshotCache()
    snap = t.mesh("1")
    cache.set_snapshot("a", snap)
    assert await asyncio.wait_for(cache.wait("a", None), 2) is snap


async def test_wait_wakes_only_the_streams_of_the_changed_key() -> None:
    cache = SnapshotCache()
    first = t.mesh("1")
    cache.set_snapshot("a", first)
    cache.set_snapshot("b", first)
    on_a = asyncio.create_task(cache.wait("a", first))
    on_b = asyncio.create_task(cache.wait("b", first))
    on_c = asyncio.create_task(cache.wait("c", None))  # no snapshot yet
    await asyncio.sleep(0)
    assert cache.waiting("a")
    assert cache.waiting("b")
    assert cache.waiting("c")

    second = t.mesh("2", ports=(9090,))
    cache.set_snapshot("a", second)
    assert await asyncio.wait_for(on_a, 2) is second
    await asyncio.sleep(0)
    assert not on_b.done()
    assert not on_c.done()

    cache.set_snapshot("c", second)
    assert await asyncio.wait_for(on_c, 2) is second
    assert not on_b.done()
    on_b.cancel()


async def test_many_waiters_of_one_key_all_wake_once() -> None:
    cache = SnapshotCache()
    waiters = [asyncio.create_task(cache.wait("k", None)) for _ in range(1000)]
    await asyncio.sleep(0)
    snap = t.mesh("1")
    cache.set_snapshot("k", snap)
    results = await asyncio.wait_for(asyncio.gather(*waiters), 2)
    assert all(r is snap for r in results)
    assert not cache.waiting("k")


def test_snapshot_is_immutable() -> None:
    snap = Snapshot.of("1", [t.resource(t.secret("a"))])
    with pytest.raises(TypeError):
        snap.resources[SECRET] = {}  # type: ignore[index]


async def test_subscribers_are_called_soon_after_their_key_moves_and_not_after_they_stop() -> None:
    cache = SnapshotCache()
    calls: list[str] = []
    stop_a = cache.subscribe("a", lambda: calls.append("a1"))
    cache.subscribe("a", lambda: calls.append("a2"))
    cache.subscribe("b", lambda: calls.append("b"))
    assert cache.subscribed("a") == 2

    cache.set_snapshot("a", t.snapshot("1"))
    assert calls == []  # never from within the setter: the caller finishes its work first
    await asyncio.sleep(0)
    assert sorted(calls) == ["a1", "a2"]  # only key a's, once each

    stop_a()
    cache.set_snapshot("a", t.snapshot("2"))
    await asyncio.sleep(0)
    assert sorted(calls) == ["a1", "a2", "a2"]
    assert cache.subscribed("a") == 1


async def test_a_change_wakes_a_keys_streams_in_the_order_they_subscribed() -> None:
    """First connected, first served, the same order at every change (a set's order
    follows the callbacks' hashes): with many streams on one key, none is always last by
    chance. One that leaves and comes back joins the end."""
    cache = SnapshotCache()
    calls: list[int] = []
    stops = [cache.subscribe("a", functools.partial(calls.append, i)) for i in range(200)]
    cache.set_snapshot("a", t.snapshot("1"))
    await asyncio.sleep(0)
    assert calls == list(range(200))

    stops[0]()
    cache.subscribe("a", lambda: calls.append(0))
    calls.clear()
    cache.set_snapshot("a", t.snapshot("2"))
    await asyncio.sleep(0)
    assert calls == [*range(1, 200), 0]
