"""The control plane: groups of proxies, their inputs, their snapshots, refusals.

Real :class:`SnapshotCache` and real translation; the catalog and certmanager are
:class:`~trellis_proxy_cp.testing.FakeSources`, which count their fetches.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET

STORE = "bookstore/bookstore"
BUYER = "bookbuyer/bookbuyer"
STORE_1 = t.proxy_common_name("bookstore", "bookstore", 1)
STORE_2 = t.proxy_common_name("bookstore", "bookstore", 2)
BUYER_1 = t.proxy_common_name("bookbuyer", "bookbuyer", 3)
DEFAULT = t.SIDECAR
OTHER_PORTS = dataclasses.replace(t.SIDECAR, outbound_port=16001, inbound_port=16003)


def labelled(
    control_plane: ProxyControlPlane, snapshot: Snapshot, identity: str, serial: str
) -> bool:
    """Whether the snapshot's version is its identity's policy version, its slices' and
    its material's ``serial``."""
    policy = control_plane.policies[identity].version
    return snapshot.version.startswith(f"{policy}/") and snapshot.version.endswith(f"/{serial}")


def listener_ports(cache: SnapshotCache, key: str) -> list[int]:
    snapshot = cache.get(key)
    assert snapshot is not None
    return sorted(
        r.body.address.socket_address.port_value  # type: ignore[attr-defined]
        for r in snapshot.of_type(LISTENER).values()
    )


# -- attach --------------------------------------------------------------------------------


async def test_proxies_of_one_identity_with_one_settings_share_a_key_and_a_snapshot(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    first = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    snapshot = cache.get(first)
    second = await control_plane.attach(STORE_2, STORE, "bookstore", DEFAULT)

    assert first == second == ProxyControlPlane.key_of(STORE, DEFAULT)
    assert cache.get(second) is snapshot  # not rebuilt for the second proxy
    assert snapshot is not None
    assert labelled(control_plane, snapshot, STORE, "s1")
    assert sources.view_fetches == [(STORE, "bookstore")]
    assert sources.material_fetches == [(STORE, "bookstore")]
    assert control_plane.groups[first].proxies == {STORE_1, STORE_2}
    assert cache.keys() == [first]


async def test_a_snapshot_has_every_type_and_the_identitys_secrets(
    control_plane: ProxyControlPlane, cache: SnapshotCache
) -> None:
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)

    snapshot = cache.get(key)
    assert snapshot is not None
    assert snapshot.type_urls() == [CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET]
    assert sorted(snapshot.of_type(SECRET)) == sorted([names.SERVICE_CERT, names.MESH_CA])
    assert sorted(snapshot.of_type(ENDPOINT)) == ["bookstore/reviews|9080"]
    assert control_plane.set_at[key] == control_plane.groups[key].built_at > 0


async def test_other_ports_make_another_group_with_its_own_listeners_but_fetch_nothing_more(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    first = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    second = await control_plane.attach(STORE_2, STORE, "bookstore", OTHER_PORTS)

    assert first != second
    assert cache.keys() == sorted([first, second])
    assert listener_ports(cache, first) == [15001, 15003]
    assert listener_ports(cache, second) == [16001, 16003]
    assert len(sources.view_fetches) == len(sources.material_fetches) == 1


def assignment(cache: SnapshotCache, key: str) -> object:
    snapshot = cache.get(key)
    assert snapshot is not None
    return snapshot.of_type(ENDPOINT)["bookstore/reviews|9080"].body


async def test_groups_of_one_plane_share_load_assignments_and_two_planes_do_not(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """Every group's view has the cluster ``bookstore/reviews|9080``: one plane builds its
    assignment once, whatever the identity or settings; another plane builds its own."""
    store_a = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    store_b = await control_plane.attach(STORE_2, STORE, "bookstore", OTHER_PORTS)
    buyer = await control_plane.attach(BUYER_1, BUYER, "bookbuyer", DEFAULT)

    shared = assignment(cache, store_a)
    assert assignment(cache, store_b) is shared
    assert assignment(cache, buyer) is shared
    assert len(control_plane.endpoint_resources) == 1
    assert control_plane.endpoint_resources.built == 1

    other_cache = SnapshotCache()
    other = sources.control_plane(other_cache)
    elsewhere = await other.attach(STORE_1, STORE, "bookstore", DEFAULT)
    assert assignment(other_cache, elsewhere) == shared
    assert assignment(other_cache, elsewhere) is not shared


async def test_concurrent_attaches_of_one_identity_fetch_once(
    control_plane: ProxyControlPlane, sources: t.FakeSources
) -> None:
    keys = await asyncio.gather(
        *(
            control_plane.attach(t.proxy_common_name("bookstore", "bookstore", n), STORE, "sa", s)
            for n, s in [(1, DEFAULT), (2, DEFAULT), (3, OTHER_PORTS)]
        )
    )

    assert len(set(keys)) == 2
    assert len(sources.view_fetches) == len(sources.material_fetches) == 1


async def test_each_identity_is_fetched_for_itself(
    control_plane: ProxyControlPlane, sources: t.FakeSources
) -> None:
    await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    await control_plane.attach(BUYER_1, BUYER, "bookbuyer", DEFAULT)

    assert sources.view_fetches == [(STORE, "bookstore"), (BUYER, "bookbuyer")]
    assert sources.material_fetches == [(STORE, "bookstore"), (BUYER, "bookbuyer")]


async def test_a_failed_fetch_leaves_no_group_behind(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    sources.failure = ConnectionError("catalog unreachable")

    with pytest.raises(ConnectionError):
        await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)

    assert control_plane.groups == {}
    assert sources.forgotten == [STORE]  # the catalog and certmanager stop following it
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)  # the retry
    assert cache.get(key) is not None
    assert control_plane.groups[key].proxies == {STORE_1}


# -- new inputs ----------------------------------------------------------------------------


async def test_a_new_view_rebuilds_only_that_identitys_groups(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """The buyer calls another upstream: nothing of its view moves (a cluster both views
    name is one slice, which rebuilds both: test_core_slices.py)."""
    sources.views[BUYER] = t.view(BUYER, upstream="bookstore/ratings")
    store_a = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    store_b = await control_plane.attach(STORE_2, STORE, "bookstore", OTHER_PORTS)
    buyer = await control_plane.attach(BUYER_1, BUYER, "bookbuyer", DEFAULT)
    buyer_snapshot = cache.get(buyer)
    before = cache.get(store_a)
    assert before is not None
    policy = control_plane.policies[STORE]

    await control_plane.set_view(STORE, t.view(STORE, "2", endpoints=("10.0.0.1", "10.0.0.2")))

    assert control_plane.policies[STORE] is policy  # only endpoints moved: one policy
    for key in (store_a, store_b):
        snapshot = cache.get(key)
        assert snapshot is not None
        assert snapshot.version != before.version
        assert labelled(control_plane, snapshot, STORE, "s1")
    after = cache.get(store_a)
    assert after is not None
    assert after.version_of(ENDPOINT) != before.version_of(ENDPOINT)
    assert after.version_of(LISTENER) == before.version_of(LISTENER)
    assert after.version_of(SECRET) == before.version_of(SECRET)
    assert cache.get(buyer) is buyer_snapshot
    assert len(sources.view_fetches) == 2  # pushed, not fetched


async def test_new_material_rebuilds_only_that_identitys_groups_and_moves_only_sds(
    control_plane: ProxyControlPlane, cache: SnapshotCache
) -> None:
    store = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    buyer = await control_plane.attach(BUYER_1, BUYER, "bookbuyer", DEFAULT)
    buyer_snapshot = cache.get(buyer)
    before = cache.get(store)
    assert before is not None

    # a new trust bundle (a root rotation) is the one secret that travels inline
    rotated = dataclasses.replace(t.material("s2"), trust_bundle_pem=b"a new trust bundle")
    await control_plane.set_material(STORE, rotated)

    after = cache.get(store)
    assert after is not None
    assert after.version == before.version.removesuffix("/s1") + "/s2"
    assert after.version_of(SECRET) != before.version_of(SECRET)
    for type_url in (CLUSTER, ENDPOINT, LISTENER, ROUTE):
        assert after.version_of(type_url) == before.version_of(type_url)
    assert cache.get(buyer) is buyer_snapshot


async def test_a_view_for_an_identity_without_proxies_builds_nothing(
    control_plane: ProxyControlPlane, cache: SnapshotCache
) -> None:
    await control_plane.set_view(STORE, t.view(STORE, "7"))

    assert cache.keys() == []
    assert control_plane.groups == {}


# -- detach --------------------------------------------------------------------------------


async def test_detach_keeps_the_snapshot_while_a_proxy_of_the_group_remains(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    await control_plane.attach(STORE_2, STORE, "bookstore", DEFAULT)

    control_plane.detach(STORE_1, key)

    assert cache.get(key) is not None
    assert control_plane.groups[key].proxies == {STORE_2}
    assert sources.forgotten == []


async def test_detach_of_the_last_proxy_clears_the_snapshot_and_forgets_the_identity(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    buyer = await control_plane.attach(BUYER_1, BUYER, "bookbuyer", DEFAULT)

    control_plane.detach(STORE_1, key)

    assert cache.get(key) is None
    assert cache.get(buyer) is not None
    assert key not in control_plane.groups
    assert STORE not in control_plane.policies
    assert control_plane.view(STORE) is None
    # what the buyer's view names is still held: its cluster's slice, no more
    assert list(control_plane.slices) == ["slice/bookstore/reviews|9080"]
    assert STORE not in control_plane.materials
    assert sources.forgotten == [STORE]
    await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    assert len(sources.view_fetches) == 3  # fetched again: nothing followed it meanwhile


async def test_the_identity_is_remembered_while_another_group_of_it_remains(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    first = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    second = await control_plane.attach(STORE_2, STORE, "bookstore", OTHER_PORTS)

    control_plane.detach(STORE_1, first)

    assert cache.get(first) is None
    assert cache.get(second) is not None
    assert sources.forgotten == []
    control_plane.detach(STORE_2, second)
    assert sources.forgotten == [STORE]


async def test_a_proxy_with_two_streams_stays_until_its_last_detaches(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """A reconnecting Envoy: the new stream attaches before the old one detaches."""
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    assert control_plane.streams_of(STORE_1) == 2

    control_plane.detach(STORE_1, key)  # the old stream

    assert control_plane.groups[key].proxies == {STORE_1}
    assert cache.get(key) is not None
    assert control_plane.streams_of(STORE_1) == 1
    assert sources.forgotten == []
    control_plane.detach(STORE_1, key)
    assert key not in control_plane.groups
    assert control_plane.streams_of(STORE_1) == 0
    assert sources.forgotten == [STORE]


async def test_a_failed_attach_of_a_second_stream_keeps_the_first(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    control_plane.policies.pop(STORE)  # so that the second attach fetches, and fails
    sources.failure = ConnectionError("catalog unreachable")

    with pytest.raises(ConnectionError):
        await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)

    assert control_plane.groups[key].proxies == {STORE_1}
    assert control_plane.streams_of(STORE_1) == 1


async def test_detach_of_an_unknown_key_or_proxy_does_nothing(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)

    control_plane.detach(STORE_1, "no such key")
    control_plane.detach(STORE_2, key)

    assert cache.get(key) is not None
    assert control_plane.groups[key].proxies == {STORE_1}
    assert sources.forgotten == []


# -- refusal -------------------------------------------------------------------------------
#
# Translation makes every cluster of a discovery it does not know (anything but DNS or
# PASSTHROUGH) an EDS cluster, but load assignments only for STATIC ones: a view with a
# cluster of an unknown discovery (a newer catalog, say) translates to an EDS cluster
# without its ClusterLoadAssignment, which Envoy would keep warming.


async def test_an_inconsistent_snapshot_is_refused_and_the_last_good_one_stays(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    good = cache.get(key)
    assert good is not None
    built_at = control_plane.groups[key].built_at

    await control_plane.set_view(STORE, t.broken_view(STORE, "2"))

    assert cache.get(key) is good
    group = control_plane.groups[key]
    assert "duplicate" in group.last_error
    assert "'bookstore/reviews|9080'" in group.last_error
    assert group.built_at == built_at
    assert sources.refused == [(key, [group.last_error])]

    await control_plane.set_view(STORE, t.view(STORE, "3"))

    fixed = cache.get(key)
    assert fixed is not None
    assert fixed is not good
    assert fixed.version == good.version  # the content of the first view, again
    assert labelled(control_plane, fixed, STORE, "s1")
    assert control_plane.groups[key].last_error == ""


async def test_a_refused_first_snapshot_leaves_the_group_waiting(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    sources.views[STORE] = t.broken_view(STORE, "1")

    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)

    assert cache.get(key) is None
    assert control_plane.groups[key].last_error
    assert [k for k, _ in sources.refused] == [key]
    await control_plane.set_view(STORE, t.view(STORE, "2"))
    assert cache.get(key) is not None


async def test_a_view_that_cannot_make_a_snapshot_is_refused_not_raised(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    # One bad view must not end the catalog follower (and with it proxy-cp): two clusters
    # of one name make two CDS resources of one name, which no snapshot can hold.
    key = await control_plane.attach(STORE_1, STORE, "bookstore", DEFAULT)
    good = cache.get(key)
    bad = t.view(STORE, "2")
    bad.clusters.append(bad.clusters[0])

    await control_plane.set_view(STORE, bad)

    assert cache.get(key) is good
    assert "duplicate" in control_plane.groups[key].last_error
    assert [k for k, _ in sources.refused] == [key]
