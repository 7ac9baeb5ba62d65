"""Incremental ADS against a real grpc.aio server and client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.testing import names_of
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, TypeUrl

DENIED = (grpc.StatusCode.PERMISSION_DENIED, "not you")


@pytest.fixture
def cache() -> SnapshotCache:
    return SnapshotCache()


@pytest.fixture
def hooks() -> t.RecordingHooks:
    return t.RecordingHooks()


@pytest.fixture
async def ads(cache: SnapshotCache, hooks: t.RecordingHooks) -> AsyncIterator[t.AdsHarness]:
    authorizer = t.StaticAuthorizer(keys={"other-1": "other"}, refuse={"intruder": DENIED})
    async with t.ads_server(cache, authorizer=authorizer, hooks=hooks) as harness:
        yield harness


def endpoints(*ports_by_cluster: tuple[int, ...]) -> Snapshot:
    """Clusters c0..cN, each with its own ports, and nothing else."""
    items = []
    for i, ports in enumerate(ports_by_cluster):
        items += [t.cluster(f"c{i}"), t.load_assignment(f"c{i}", *ports)]
    return t.snapshot("v", *items)


def version(snapshot: Snapshot, type_url: str, name: str) -> str:
    return snapshot.of_type(TypeUrl(type_url))[name].version


async def test_wildcard_cds_then_eds_by_name_with_acks(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    snap = t.mesh("1")
    cache.set_snapshot("mesh", snap)
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=CLUSTER)
    cds = await envoy.recv()
    assert (cds.type_url, cds.system_version_info) == (CLUSTER, snap.version_of(CLUSTER))
    assert names_of(cds) == ["c0", "c1"]
    assert [r.version for r in cds.resources] == [version(snap, CLUSTER, n) for n in ("c0", "c1")]
    assert cds.resources[0].resource == snap.of_type(CLUSTER)["c0"].any
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=["c0", "c1"])
    eds = await envoy.recv()
    assert names_of(eds) == ["c0", "c1"]
    assert list(eds.removed_resources) == []
    await envoy.ack(cds)
    await envoy.ack(eds)
    await envoy.quiet()
    assert hooks.of("ack") == [
        ("ack", "envoy-1", CLUSTER, cds.system_version_info),
        ("ack", "envoy-1", ENDPOINT, eds.system_version_info),
    ]
    (stream,) = ads.servicer.registry
    assert stream.protocol == "delta"
    assert stream.types[CLUSTER].wildcard


async def test_subscribe_and_unsubscribe_by_name(ads: t.AdsHarness, cache: SnapshotCache) -> None:
    cache.set_snapshot("mesh", endpoints((1,), (2,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names_subscribe=["c0"])
    first = await envoy.recv()
    assert names_of(first) == ["c0"]
    await envoy.ack(first)
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=["c1"])
    second = await envoy.recv()
    assert names_of(second) == ["c1"]  # c0 is held already
    await envoy.ack(second)
    await envoy.send(type_url=ENDPOINT, resource_names_unsubscribe=["c0"])
    await envoy.quiet()  # an unsubscription needs no answer

    cache.set_snapshot("mesh", endpoints((10,), (20,)))
    pushed = await envoy.recv()
    assert names_of(pushed) == ["c1"]  # c0 changed too, but is no longer wanted
    await envoy.quiet()


async def test_only_changed_resources_are_sent_and_removals_named(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    cache.set_snapshot("mesh", endpoints((1,), (2,), (3,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=CLUSTER)
    await envoy.ack(await envoy.recv())
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=["c0", "c1", "c2"])
    await envoy.ack(await envoy.recv())

    cache.set_snapshot("mesh", endpoints((1,), (22,), (3,)))
    eds = await envoy.recv()
    assert (eds.type_url, names_of(eds), list(eds.removed_resources)) == (ENDPOINT, ["c1"], [])
    await envoy.ack(eds)
    await envoy.quiet()  # clusters did not change

    cache.set_snapshot("mesh", endpoints((1,), (22,)))
    cds = await envoy.recv()
    assert (cds.type_url, names_of(cds), list(cds.removed_resources)) == (CLUSTER, [], ["c2"])
    eds = await envoy.recv()
    assert (eds.type_url, names_of(eds), list(eds.removed_resources)) == (ENDPOINT, [], ["c2"])
    await envoy.quiet()


async def test_an_updated_eds_cluster_gets_its_load_assignment_again(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    """Envoy warms an updated EDS cluster until its assignment arrives, and over delta it does
    not ask again (the name stays subscribed): the assignment follows the CDS response."""
    cache.set_snapshot("mesh", endpoints((1,), (2,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=CLUSTER)
    await envoy.ack(await envoy.recv())
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=["c0", "c1"])
    await envoy.ack(await envoy.recv())

    changed = t.cluster("c0")
    changed.connect_timeout.FromMilliseconds(900)  # the cluster moves, its endpoints do not
    cache.set_snapshot(
        "mesh",
        t.snapshot(
            "v2", changed, t.load_assignment("c0", 1), t.cluster("c1"), t.load_assignment("c1", 2)
        ),
    )
    cds = await envoy.recv()
    assert (cds.type_url, names_of(cds)) == (CLUSTER, ["c0"])
    eds = await envoy.recv()
    assert (eds.type_url, names_of(eds)) == (ENDPOINT, ["c0"])  # the same assignment, again
    await envoy.ack(cds)
    await envoy.ack(eds)
    await envoy.quiet()

    cache.set_snapshot("mesh", endpoints((1,), (2,), (3,)))  # a new cluster: Envoy asks itself
    cds = await envoy.recv()
    assert names_of(cds) == ["c0", "c2"]  # c0 back to its old timeout, c2 new
    eds = await envoy.recv()
    assert names_of(eds) == ["c0"]


async def test_initial_resource_versions_suppress_what_the_proxy_holds(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    snap = endpoints((1,), (2,))
    cache.set_snapshot("mesh", snap)
    envoy = await ads.open(delta=True)
    held = {n: version(snap, CLUSTER, n) for n in ("c0", "c1")}
    await envoy.send(node=t.node(), type_url=CLUSTER, initial_resource_versions=held)
    cds = await envoy.recv()  # answered although nothing differs
    assert (names_of(cds), list(cds.removed_resources)) == ([], [])
    await envoy.send(
        type_url=ENDPOINT,
        resource_names_subscribe=["c0", "c1", "gone"],
        initial_resource_versions={
            "c0": version(snap, ENDPOINT, "c0"),
            "c1": "outdated",
            "gone": "old",
        },
    )
    eds = await envoy.recv()
    assert (names_of(eds), list(eds.removed_resources)) == (["c1"], ["gone"])


async def test_subscribing_to_a_missing_name_says_it_does_not_exist(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    cache.set_snapshot("mesh", t.mesh("1"))
    grpc_client = await ads.open(delta=True)
    await grpc_client.send(node=t.node(), type_url=LISTENER, resource_names_subscribe=["nope"])
    lds = await grpc_client.recv()
    assert (names_of(lds), list(lds.removed_resources)) == ([], ["nope"])
    await grpc_client.ack(lds)
    cache.set_snapshot("mesh", t.mesh("2", ports=(1,)))  # nothing new for this proxy
    await grpc_client.quiet()


async def test_resubscribing_resends_a_held_resource(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    cache.set_snapshot("mesh", endpoints((1,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names_subscribe=["c0"])
    await envoy.ack(await envoy.recv())
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=["c0"])
    assert names_of(await envoy.recv()) == ["c0"]


async def test_nack_is_recorded_and_nothing_resent(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    cache.set_snapshot("mesh", endpoints((1,), (2,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names_subscribe=["c0", "c1"])
    await envoy.ack(await envoy.recv())

    bad = endpoints((9,), (2,))
    cache.set_snapshot("mesh", bad)
    pushed = await envoy.recv()
    assert names_of(pushed) == ["c0"]
    await envoy.nack(pushed, "c0: bad endpoint")
    await envoy.quiet()
    assert hooks.of("nack") == [
        ("nack", "envoy-1", ENDPOINT, bad.version_of(ENDPOINT), "c0: bad endpoint")
    ]
    (stream,) = ads.servicer.registry
    assert (stream.types[ENDPOINT].nack_count, stream.types[ENDPOINT].last_error) == (
        1,
        "c0: bad endpoint",
    )

    cache.set_snapshot("mesh", endpoints((9,), (3,)))  # c0 unchanged since the NACK
    assert names_of(await envoy.recv()) == ["c1"]


async def test_a_stale_nonce_still_changes_the_subscription(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    cache.set_snapshot("mesh", endpoints((1,), (2,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names_subscribe=["c0"])
    first = await envoy.recv()
    await envoy.ack(first)
    cache.set_snapshot("mesh", endpoints((5,), (2,)))
    await envoy.recv()  # a newer response: the first's nonce is stale now
    acks = len(hooks.of("ack"))
    await envoy.send(type_url=ENDPOINT, response_nonce=first.nonce, resource_names_subscribe=["c1"])
    assert names_of(await envoy.recv()) == ["c1"]
    assert len(hooks.of("ack")) == acks  # the stale nonce acknowledged nothing


async def test_one_response_in_flight_per_type_and_its_answer_sends_what_moved_meanwhile(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    """Flow control: snapshot changes while the proxy has not answered the type's last
    response wait for its answer, then go out as one response at the latest versions; a
    type with nothing in flight, and what the proxy asks for, are answered at once."""
    cache.set_snapshot("mesh", endpoints((1,), (2,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names_subscribe=["c0"])
    first = await envoy.recv()
    cache.set_snapshot("mesh", endpoints((3,), (2,)))
    latest = endpoints((4,), (2,))
    cache.set_snapshot("mesh", latest)
    await envoy.quiet()  # the first is not answered yet: nothing more
    await envoy.ack(first)  # its answer: what moved meanwhile goes out, in one response
    moved = await envoy.recv()
    assert [(r.name, r.version) for r in moved.resources] == [
        ("c0", version(latest, ENDPOINT, "c0"))
    ]
    await envoy.quiet()
    await envoy.ack(moved)
    cache.set_snapshot("mesh", endpoints((5,), (2,)))  # nothing in flight: pushed at once
    pushed = await envoy.recv()
    assert names_of(pushed) == ["c0"]
    await envoy.send(type_url=ENDPOINT, resource_names_subscribe=["c1"])  # asked: answered,
    asked = await envoy.recv()  # though a response is in flight
    assert names_of(asked) == ["c1"]
    assert len(hooks.of("ack")) == 2


async def test_push_on_change_reaches_only_that_key(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    cache.set_snapshot("mesh", endpoints((1,)))
    cache.set_snapshot("other", endpoints((1,)))
    envoy, bystander = await ads.open(delta=True), await ads.open(delta=True)
    for client, node_id in ((envoy, "envoy-1"), (bystander, "other-1")):
        await client.send(node=t.node(node_id), type_url=ENDPOINT, resource_names_subscribe=["c0"])
        await client.ack(await client.recv())
    cache.set_snapshot("mesh", endpoints((2,)))
    assert names_of(await envoy.recv()) == ["c0"]
    await bystander.quiet()


async def test_wildcard_with_an_explicit_name_answers_its_unsubscription(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    cache.set_snapshot("mesh", endpoints((1,)))
    envoy = await ads.open(delta=True)
    await envoy.send(node=t.node(), type_url=CLUSTER, resource_names_subscribe=["*", "c0", "x"])
    cds = await envoy.recv()
    assert (names_of(cds), list(cds.removed_resources)) == (["c0"], ["x"])
    await envoy.ack(cds)
    await envoy.send(type_url=CLUSTER, resource_names_unsubscribe=["c0"])
    answer = await envoy.recv()  # c0 is still part of the wildcard: say so
    assert names_of(answer) == ["c0"]


async def test_refused_and_invalid_delta_streams(ads: t.AdsHarness) -> None:
    intruder = await ads.open(delta=True)
    await intruder.send(node=t.node("intruder"), type_url=CLUSTER)
    assert await intruder.status() == DENIED[0]
    assert await intruder.details() == DENIED[1]
    nameless = await ads.open(delta=True)
    await nameless.send(type_url=CLUSTER)
    assert await nameless.status() == grpc.StatusCode.INVALID_ARGUMENT
