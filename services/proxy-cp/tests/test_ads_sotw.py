"""ADS state of the world against a real grpc.aio server and client, walking like Envoy 1.40."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import base_pb2

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.testing import names_of
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET
from trellis_testing.waiting import eventually

DENIED = (grpc.StatusCode.PERMISSION_DENIED, "node id does not match the certificate")


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


def with_cluster_timeout(snapshot: Snapshot, version: str, millis: int) -> Snapshot:
    """The same snapshot with cluster c0 changed (so only CDS changes)."""
    changed = t.cluster("c0", cert=t.CERT, ca=t.CA)
    changed.connect_timeout.FromMilliseconds(millis)
    kept = [r for by_name in snapshot.resources.values() for r in by_name.values()]
    return t.snapshot(
        version, t.resource(changed), *[r for r in kept if r.name != "c0" or r.type_url != CLUSTER]
    )


async def cds_eds(envoy: t.AdsClient, node_id: str = "envoy-1") -> tuple[Any, Any]:
    """CDS wildcard, EDS for both clusters, then ACK both; returns the two responses."""
    await envoy.send(node=t.node(node_id), type_url=CLUSTER)
    cds = await envoy.recv()
    await envoy.send(type_url=ENDPOINT, resource_names=["c1", "c0"])
    eds = await envoy.recv()
    await envoy.ack(cds)
    await envoy.ack(eds, ["c0", "c1"])
    await envoy.quiet()
    return cds, eds


async def test_envoy_walk_cds_eds_lds_rds_sds(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    snap = t.mesh("1")
    cache.set_snapshot("mesh", snap)
    envoy = await ads.open()

    await envoy.send(node=t.node(), type_url=CLUSTER)
    cds = await envoy.recv()
    assert (cds.type_url, cds.version_info) == (CLUSTER, snap.version_of(CLUSTER))
    assert names_of(cds) == ["c0", "c1"]
    # Envoy asks for EDS before it ACKs CDS.
    await envoy.send(type_url=ENDPOINT, resource_names=["c1", "c0"])
    eds = await envoy.recv()
    assert (eds.type_url, eds.version_info) == (ENDPOINT, snap.version_of(ENDPOINT))
    assert names_of(eds) == ["c0", "c1"]
    await envoy.ack(cds)
    await envoy.quiet()  # an ACK is not answered
    # LDS once the clusters warmed; RDS before the LDS ACK.
    await envoy.send(type_url=LISTENER)
    lds = await envoy.recv()
    assert names_of(lds) == ["l0"]
    await envoy.send(type_url=ROUTE, resource_names=["r0"])
    rds = await envoy.recv()
    assert names_of(rds) == ["r0"]
    await envoy.send(type_url=SECRET, resource_names=[t.CERT, t.CA])
    sds = await envoy.recv()
    assert names_of(sds) == sorted([t.CA, t.CERT])
    await envoy.ack(eds, ["c0", "c1"])
    await envoy.ack(lds)
    await envoy.ack(rds, ["r0"])
    await envoy.ack(sds, sorted([t.CA, t.CERT]))
    await envoy.quiet()

    responses = [cds, eds, lds, rds, sds]
    assert len({r.nonce for r in responses}) == 5
    expected = [("ack", "envoy-1", r.type_url, r.version_info) for r in responses]
    assert hooks.of("ack") == expected
    assert hooks.of("sent") == [("sent", "envoy-1", r.type_url, r.version_info) for r in responses]
    (stream,) = ads.servicer.registry
    assert stream.protocol == "sotw"
    assert stream.key == "mesh"
    assert stream.types[ENDPOINT].names == {"c0", "c1"}
    assert stream.types[CLUSTER].wildcard
    assert all(stream.types[r.type_url].acked_version == r.version_info for r in responses)


async def test_nack_is_recorded_and_the_rejected_version_not_resent(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    first = t.mesh("1")
    cache.set_snapshot("mesh", first)
    envoy = await ads.open()
    cds, _ = await cds_eds(envoy)

    bad = with_cluster_timeout(first, "2", 999)
    cache.set_snapshot("mesh", bad)
    pushed = await envoy.recv()
    assert (pushed.type_url, pushed.version_info) == (CLUSTER, bad.version_of(CLUSTER))
    await envoy.nack(pushed, "cluster c0: bad timeout", accepted=cds.version_info)
    await envoy.quiet()
    assert hooks.of("nack") == [
        ("nack", "envoy-1", CLUSTER, bad.version_of(CLUSTER), "cluster c0: bad timeout")
    ]
    (stream,) = ads.servicer.registry
    state = stream.types[CLUSTER]
    assert (state.nack_count, state.last_error) == (1, "cluster c0: bad timeout")
    assert state.acked_version == cds.version_info

    # An endpoint change pushes EDS only: the NACKed clusters are not sent again.
    endpoints = with_cluster_timeout(t.mesh("3", ports=(9090,)), "3", 999)
    cache.set_snapshot("mesh", endpoints)
    eds = await envoy.recv()
    assert eds.type_url == ENDPOINT
    await envoy.quiet()

    # A new cluster version is pushed, and its ACK clears the error.
    fixed = with_cluster_timeout(endpoints, "4", 500)
    cache.set_snapshot("mesh", fixed)
    again = await envoy.recv()
    assert (again.type_url, again.version_info) == (CLUSTER, fixed.version_of(CLUSTER))
    await envoy.ack(again)
    await envoy.quiet()
    assert (state.acked_version, state.last_error) == (fixed.version_of(CLUSTER), None)


async def eds_of_c0(ads: t.AdsHarness, cache: SnapshotCache) -> tuple[t.AdsClient, Any]:
    """A proxy of the mesh at version 1 asking for EDS of ``c0``, and its first answer."""
    cache.set_snapshot("mesh", t.mesh("1"))
    envoy = await ads.open()
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names=["c0"])
    return envoy, await envoy.recv()


async def test_a_stale_nonce_is_ignored_and_keeps_the_subscription(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    envoy, first = await eds_of_c0(ads, cache)
    await envoy.ack(first, ["c0"])
    cache.set_snapshot("mesh", t.mesh("2", ports=(9090,)))
    second = await envoy.recv()
    assert names_of(second) == ["c0"]

    # A request that still carries the first nonce crossed the second response: stale.
    await envoy.send(
        type_url=ENDPOINT,
        version_info=first.version_info,
        response_nonce=first.nonce,
        resource_names=["c0", "c1"],
    )
    await envoy.quiet()
    (stream,) = ads.servicer.registry
    assert stream.types[ENDPOINT].names == {"c0"}
    await envoy.ack(second, ["c0"])
    cache.set_snapshot("mesh", t.mesh("3", ports=(9091,)))
    assert names_of(await envoy.recv()) == ["c0"]


async def test_one_response_in_flight_per_type_and_its_answer_sends_the_newest(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    envoy, first = await eds_of_c0(ads, cache)
    cache.set_snapshot("mesh", t.mesh("2", ports=(9090,)))
    cache.set_snapshot("mesh", t.mesh("3", ports=(9091,)))
    await envoy.quiet()  # the first is not answered yet: nothing more goes out

    await envoy.ack(first, ["c0"])
    newest = await envoy.recv()
    assert newest.version_info == t.mesh("3", ports=(9091,)).version_of(ENDPOINT)
    assert names_of(newest) == ["c0"]
    await envoy.quiet()  # the version in between is never sent

    cache.set_snapshot("mesh", t.mesh("4", ports=(9092,)))
    await envoy.quiet()
    await envoy.nack(newest, "bad endpoint", accepted=first.version_info, names=["c0"])
    after_nack = await envoy.recv()  # a NACK answers the response in flight too
    assert after_nack.version_info == t.mesh("4", ports=(9092,)).version_of(ENDPOINT)
    await envoy.nack(after_nack, "still bad", accepted=first.version_info, names=["c0"])
    await envoy.quiet()  # and the version it rejected is not sent again


async def test_new_names_in_an_ack_are_answered(ads: t.AdsHarness, cache: SnapshotCache) -> None:
    snap = t.mesh("1")
    cache.set_snapshot("mesh", snap)
    envoy = await ads.open()
    await envoy.send(node=t.node(), type_url=ENDPOINT, resource_names=["c0"])
    eds = await envoy.recv()
    await envoy.ack(eds, ["c1", "c0"])
    again = await envoy.recv()
    assert (again.version_info, names_of(again)) == (eds.version_info, ["c0", "c1"])
    assert again.nonce != eds.nonce
    await envoy.ack(again, ["c0", "c1"])  # same names as a set, other order
    await envoy.quiet()


async def test_eds_rerequest_with_the_acked_nonce_after_a_cluster_update_is_answered(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    """envoy-xds-facts item 6: after a cluster update Envoy re-sends its EDS request with
    the already ACKed nonce and the same names; the updated cluster warms until answered."""
    first = t.mesh("1")
    cache.set_snapshot("mesh", first)
    envoy = await ads.open()
    _, eds = await cds_eds(envoy)

    updated = with_cluster_timeout(first, "2", 750)
    assert updated.version_of(ENDPOINT) == first.version_of(ENDPOINT)
    cache.set_snapshot("mesh", updated)
    cds = await envoy.recv()
    assert cds.type_url == CLUSTER
    await envoy.quiet()  # endpoints did not change: no EDS push

    await envoy.send(
        type_url=ENDPOINT,
        version_info=eds.version_info,
        response_nonce=eds.nonce,
        resource_names=["c1", "c0"],
    )
    answer = await envoy.recv()
    assert (answer.type_url, answer.version_info) == (ENDPOINT, first.version_of(ENDPOINT))
    assert names_of(answer) == ["c0", "c1"]
    await envoy.ack(cds)
    await envoy.ack(answer, ["c0", "c1"])
    await envoy.quiet()


async def test_a_reconnecting_envoy_is_answered_at_its_version(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    snap = t.mesh("1")
    cache.set_snapshot("mesh", snap)
    before = await ads.open()
    await cds_eds(before)
    await before.close()
    await eventually(lambda: len(ads.servicer.registry) == 0, timeout=2)
    assert ("close", "envoy-1") in hooks.calls

    after = await ads.open()
    version = snap.version_of(CLUSTER)
    await after.send(node=t.node(), type_url=CLUSTER, version_info=version)
    again = await after.recv()
    assert (again.version_info, names_of(again)) == (version, ["c0", "c1"])
    await after.send(
        type_url=ENDPOINT, version_info=snap.version_of(ENDPOINT), resource_names=["c0", "c1"]
    )
    assert names_of(await after.recv()) == ["c0", "c1"]


async def test_requests_before_the_first_snapshot_wait_for_it(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    envoy = await ads.open()
    await envoy.send(node=t.node(), type_url=CLUSTER)
    with pytest.raises(TimeoutError):
        await envoy.recv(timeout=0.1)
    snap = t.mesh("1")
    cache.set_snapshot("mesh", snap)
    cds = await envoy.recv()
    assert (cds.version_info, names_of(cds)) == (snap.version_of(CLUSTER), ["c0", "c1"])


async def test_a_change_pushes_changed_subscribed_types_in_order_to_that_key_only(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    first = t.mesh("1")
    cache.set_snapshot("mesh", first)
    cache.set_snapshot("other", first)
    envoy = await ads.open()
    await cds_eds(envoy)
    await envoy.send(type_url=LISTENER)
    await envoy.ack(await envoy.recv())
    bystander = await ads.open()
    await cds_eds(bystander, "other-1")

    # Endpoints only: one EDS push, nothing for CDS or LDS, nothing on the other key.
    endpoints = t.mesh("2", ports=(9090,))
    cache.set_snapshot("mesh", endpoints)
    eds = await envoy.recv()
    assert (eds.type_url, eds.version_info) == (ENDPOINT, endpoints.version_of(ENDPOINT))
    await envoy.ack(eds, ["c0", "c1"])
    await envoy.quiet()
    await bystander.quiet()

    # Clusters and endpoints: CDS first, then EDS; RDS and SDS were never requested.
    both = t.mesh("3", ports=(9091,), clusters=3)
    cache.set_snapshot("mesh", both)
    assert (await envoy.recv()).type_url == CLUSTER
    assert (await envoy.recv()).type_url == ENDPOINT
    await envoy.quiet()
    await bystander.quiet()


async def test_a_refused_stream_is_aborted_with_the_authorizers_status(
    ads: t.AdsHarness, cache: SnapshotCache, hooks: t.RecordingHooks
) -> None:
    cache.set_snapshot("mesh", t.mesh("1"))
    intruder = await ads.open()
    await intruder.send(node=t.node("intruder"), type_url=CLUSTER)
    assert await intruder.status() == DENIED[0]
    assert await intruder.details() == DENIED[1]
    # Reported as refused (metrics, rejected records), never opened.
    assert hooks.calls == [("refused", "intruder", "sotw", "PERMISSION_DENIED", "refused")]


async def test_a_first_request_without_node_is_invalid(
    ads: t.AdsHarness, hooks: t.RecordingHooks
) -> None:
    envoy = await ads.open()
    await envoy.send(type_url=CLUSTER)
    assert await envoy.status() == grpc.StatusCode.INVALID_ARGUMENT
    assert hooks.calls == [("refused", "", "sotw", "INVALID_ARGUMENT", "no_node")]


async def test_a_request_without_type_url_is_invalid(ads: t.AdsHarness) -> None:
    envoy = await ads.open()
    await envoy.send(node=base_pb2.Node(id="envoy-1"))
    assert await envoy.status() == grpc.StatusCode.INVALID_ARGUMENT


async def test_fifty_streams_all_get_their_push(ads: t.AdsHarness, cache: SnapshotCache) -> None:
    first = t.mesh("1")
    cache.set_snapshot("mesh", first)
    envoys = [await ads.open() for _ in range(50)]

    async def subscribe(envoy: t.AdsClient, i: int) -> None:
        await envoy.send(node=t.node(f"envoy-{i}"), type_url=CLUSTER)
        await envoy.ack(await envoy.recv())
        await envoy.quiet()

    await asyncio.gather(*(subscribe(e, i) for i, e in enumerate(envoys)))
    assert len(ads.servicer.registry) == 50
    changed = with_cluster_timeout(first, "2", 400)
    cache.set_snapshot("mesh", changed)
    pushes = await asyncio.gather(*(e.recv() for e in envoys))
    assert {(p.type_url, p.version_info) for p in pushes} == {
        (CLUSTER, changed.version_of(CLUSTER))
    }


async def test_one_failing_stream_leaves_the_others_alone(
    ads: t.AdsHarness, cache: SnapshotCache
) -> None:
    cache.set_snapshot("mesh", t.mesh("1"))
    good = await ads.open()
    await good.send(node=t.node("good"), type_url=CLUSTER)
    await good.ack(await good.recv())
    bad = await ads.open()
    await bad.send(type_url=CLUSTER)  # no node
    assert await bad.status() == grpc.StatusCode.INVALID_ARGUMENT
    await good.quiet()
    cache.set_snapshot("mesh", t.mesh("2", clusters=3))
    assert names_of(await good.recv()) == ["c0", "c1", "c2"]


class ExplodingHooks(t.RecordingHooks):
    def on_sent(self, stream: object, type_url: object, version: object) -> None:
        raise RuntimeError("metrics backend down")


async def test_a_failing_hook_does_not_end_the_stream(cache: SnapshotCache) -> None:
    cache.set_snapshot("mesh", t.mesh("1"))
    async with t.ads_server(cache, hooks=ExplodingHooks()) as ads:
        envoy = await ads.open()
        await envoy.send(node=t.node(), type_url=CLUSTER)
        await envoy.ack(await envoy.recv())
        cache.set_snapshot("mesh", t.mesh("2", clusters=3))
        assert names_of(await envoy.recv()) == ["c0", "c1", "c2"]


async def test_a_stream_whose_outbox_overflows_is_ended(cache: SnapshotCache) -> None:
    cache.set_snapshot("mesh", t.mesh("1"))
    async with t.ads_server(cache, queue_size=1) as ads:
        envoy = await ads.open()
        await cds_eds(envoy)
        cache.set_snapshot("mesh", t.mesh("2", ports=(1,), clusters=3))  # CDS and EDS at once
        assert await envoy.status() == grpc.StatusCode.RESOURCE_EXHAUSTED
