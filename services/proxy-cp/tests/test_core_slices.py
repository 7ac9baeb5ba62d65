"""The control plane's slices: a cluster's endpoints, shared by every group that names it.

A slice whose endpoints moved (and nothing else) costs one load assignment, translated and
serialized once, which every group holding it takes in place of the old one, its other
types shared as they were; what else reads those endpoints (CDS of a DNS cluster, a
capturing sidecar's listener, a proxyless client) rebuilds whole. Real
:class:`SnapshotCache` and real translation, fed by
:class:`~trellis_proxy_cp.testing.FakeSources`.
"""

from __future__ import annotations

import dataclasses

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache import inputs
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET

UPSTREAM = "mesh/svc-0"
CLUSTER_NAME = f"{UPSTREAM}|8080"
SLICE = f"slice/{CLUSTER_NAME}"
OTHER_TYPES = (LISTENER, ROUTE, CLUSTER, SECRET)
CAPTURE = dataclasses.replace(t.SIDECAR, capture=True)
PROXYLESS = ProxySettings(proxyless=True)


def upstream_view(identity: str, *addresses: str, discovery: str = "STATIC") -> pb.View:
    """``identity`` calling ``mesh/svc-0`` on 8080 (at ``addresses``, else 10.1.0.1)."""
    return t.view(identity, upstream=UPSTREAM, upstream_port=8080,
                  endpoints=addresses or ("10.1.0.1",), discovery=discovery)  # fmt: skip


def new_slice(*addresses: str, spiffe_id: str = "") -> pb.ClusterSlice:
    """The slice of ``mesh/svc-0|8080`` at ``addresses`` (its SPIFFE id ``spiffe_id``,
    else the one :func:`upstream_view` gives), as the catalog would publish it."""
    view = upstream_view("any/any", *addresses)
    if spiffe_id:
        view.clusters[0].spiffe_ids[:] = [spiffe_id]
    return inputs.split(view).slices[SLICE]


async def attach(
    control_plane: ProxyControlPlane,
    sources: t.FakeSources,
    number: int,
    settings: ProxySettings = t.SIDECAR,
    view: pb.View | None = None,
) -> str:
    """Attach proxy ``number`` of identity ``ns<number>/app<number>``; its snapshot key."""
    identity = f"ns{number}/app{number}"
    sources.views[identity] = view or upstream_view(identity)
    proxy = t.proxy_common_name(f"app{number}", f"ns{number}", number)
    return await control_plane.attach(proxy, identity, f"app{number}", settings)


def current(cache: SnapshotCache, key: str) -> Snapshot:
    snapshot = cache.get(key)
    assert snapshot is not None
    return snapshot


def addresses_of(snapshot: Snapshot) -> list[str]:
    body = snapshot.of_type(ENDPOINT)[CLUSTER_NAME].body
    return sorted(
        lb.endpoint.address.socket_address.address
        for group in body.endpoints  # type: ignore[attr-defined]
        for lb in group.lb_endpoints
    )


def assert_shared(before: Snapshot, after: Snapshot) -> None:
    """Every type but EDS is the very same resources as before."""
    for type_url in OTHER_TYPES:
        assert after.of_type(type_url).keys() == before.of_type(type_url).keys()
        for name, resource in after.of_type(type_url).items():
            assert resource is before.of_type(type_url)[name], (type_url, name)
        assert after.version_of(type_url) == before.version_of(type_url)


# -- endpoints only ------------------------------------------------------------------------


async def test_one_moved_endpoint_builds_one_assignment_that_every_group_shares(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    keys = [await attach(control_plane, sources, n) for n in range(50)]
    before = {key: current(cache, key) for key in keys}
    assert control_plane.endpoint_resources.built == 1  # one for the 50 groups
    assert list(control_plane.slices) == [SLICE]

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.2")})

    assert control_plane.endpoint_resources.built == 2  # one more, whatever the groups
    shared = current(cache, keys[0]).of_type(ENDPOINT)[CLUSTER_NAME]
    assert addresses_of(current(cache, keys[0])) == ["10.1.0.2"]
    for key in keys:
        after = current(cache, key)
        assert after.of_type(ENDPOINT)[CLUSTER_NAME] is shared
        assert after.version_of(ENDPOINT) != before[key].version_of(ENDPOINT)
        assert_shared(before[key], after)
        identity = control_plane.groups[key].identity
        assert after.version != before[key].version
        assert after.version.startswith(f"{control_plane.policies[identity].version}/")
        assert after.version.endswith("/s1")
        assert after.consistent() == []


async def test_a_whole_view_with_moved_endpoints_takes_the_same_path(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """``set_view`` of one identity moves the slice every holder names: both rebuild."""
    first = await attach(control_plane, sources, 1)
    second = await attach(control_plane, sources, 2)
    before = {key: current(cache, key) for key in (first, second)}
    policy = control_plane.policies["ns1/app1"]

    await control_plane.set_view("ns1/app1", upstream_view("ns1/app1", "10.1.0.9"))

    assert control_plane.policies["ns1/app1"] is policy  # kept: the same version
    for key in (first, second):
        assert addresses_of(current(cache, key)) == ["10.1.0.9"]
        assert_shared(before[key], current(cache, key))


async def test_a_cluster_that_fails_over_has_one_assignment_per_proxy_locality(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    def located(*addresses: str) -> pb.View:
        view = upstream_view("ns1/app1", *addresses)
        view.mesh.locality_failover = True
        view.clusters[0].connection.outlier_detection.consecutive_5xx = 5
        for endpoint, locality in zip(view.clusters[0].endpoints, ("r1/z1", "r1/z2"), strict=True):
            endpoint.locality = locality
        return view

    keys = [
        await attach(
            control_plane,
            sources,
            1,
            dataclasses.replace(t.SIDECAR, locality=z),
            located("10.1.0.1", "10.1.0.2"),
        )
        for z in ("r1/z1", "r1/z2")
    ]
    before = {key: current(cache, key) for key in keys}
    assert control_plane.endpoint_resources.built == 2

    await control_plane.apply(
        {}, {SLICE: inputs.split(located("10.1.0.1", "10.1.0.3")).slices[SLICE]}
    )

    assert control_plane.endpoint_resources.built == 4  # one more per locality
    for key, near in zip(keys, ("10.1.0.1", "10.1.0.3"), strict=True):
        after = current(cache, key)
        assert_shared(before[key], after)
        body = after.of_type(ENDPOINT)[CLUSTER_NAME].body
        first = [g for g in body.endpoints if g.priority == 0]  # type: ignore[attr-defined]
        assert [lb.endpoint.address.socket_address.address for lb in first[0].lb_endpoints] == [
            near
        ]


async def test_a_slice_of_the_same_version_changes_nothing(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1)
    before = current(cache, key)

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.1")})  # what it has already

    assert current(cache, key) is before  # not rebuilt
    assert control_plane.endpoint_resources.built == 1


async def test_a_slice_a_later_attach_fetched_reaches_the_groups_that_held_it(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """The second identity's fetch answers the slice's next version before the catalog
    says it moved: the first identity's groups, built from the one before, still get it."""
    first = await attach(control_plane, sources, 1)
    await attach(control_plane, sources, 2, view=upstream_view("ns2/app2", "10.1.0.5"))
    assert control_plane.slices[SLICE] == new_slice("10.1.0.5")

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.5")})  # the catalog catches up

    assert addresses_of(current(cache, first)) == ["10.1.0.5"]


# -- whole rebuilds ------------------------------------------------------------------------


async def test_new_spiffe_ids_rebuild_the_cluster_that_verifies_them(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1)
    before = current(cache, key)
    renamed = f"{t.SPIFFE_PREFIX}mesh/sa/svc-0-v2"

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.2", spiffe_id=renamed)})

    after = current(cache, key)
    cluster = after.of_type(CLUSTER)[CLUSTER_NAME]
    assert cluster.version != before.of_type(CLUSTER)[CLUSTER_NAME].version
    assert renamed in str(cluster.body)  # the SAN the upstream's certificate must have
    assert addresses_of(after) == ["10.1.0.2"]


async def test_a_dns_cluster_carries_its_endpoints_in_cds(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    view = upstream_view("ns1/app1", "10.1.0.1", discovery="DNS")
    key = await attach(control_plane, sources, 1, view=view)
    before = current(cache, key)
    assert CLUSTER_NAME not in before.of_type(ENDPOINT)
    moved = inputs.split(upstream_view("ns1/app1", "db.example", discovery="DNS"))

    await control_plane.apply({}, {SLICE: moved.slices[SLICE]})

    cluster = current(cache, key).of_type(CLUSTER)[CLUSTER_NAME]
    assert cluster.version != before.of_type(CLUSTER)[CLUSTER_NAME].version
    assert "db.example" in str(cluster.body)


async def test_a_capturing_sidecar_matches_the_endpoints_of_a_service_without_addresses(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1, CAPTURE)
    before = current(cache, key)

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.1", "10.1.0.7")})

    after = current(cache, key)
    assert after.version_of(LISTENER) != before.version_of(LISTENER)
    outbound = after.of_type(LISTENER)[names.OUTBOUND_LISTENER].body
    matched = {
        prefix.address_prefix
        for chain in outbound.filter_chains  # type: ignore[attr-defined]
        for prefix in chain.filter_chain_match.prefix_ranges
    }
    assert {"10.1.0.1", "10.1.0.7"} <= matched
    assert addresses_of(after) == ["10.1.0.1", "10.1.0.7"]


async def test_a_capturing_sidecar_of_a_service_with_addresses_moves_only_eds(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    view = upstream_view("ns1/app1")
    view.outbound[0].addresses.append("10.96.0.10")  # a ClusterIP: matched on it instead
    key = await attach(control_plane, sources, 1, CAPTURE, view)
    before = current(cache, key)

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.7")})

    after = current(cache, key)
    assert_shared(before, after)
    assert addresses_of(after) == ["10.1.0.7"]


async def test_a_proxyless_client_is_rebuilt_whole(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1, PROXYLESS)
    before = current(cache, key)
    built = control_plane.endpoint_resources.built

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.7")})

    after = current(cache, key)
    assert addresses_of(after) == ["10.1.0.7"]
    assert control_plane.endpoint_resources.built == built  # its own, without unix://
    for type_url in (LISTENER, CLUSTER):
        assert after.of_type(type_url), type_url
        for name, resource in after.of_type(type_url).items():
            assert resource is not before.of_type(type_url)[name]  # made again
            assert resource == before.of_type(type_url)[name]  # to the same content


async def test_a_policy_and_its_slice_in_one_change_rebuild_whole(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1)
    before = current(cache, key)
    view = upstream_view("ns1/app1", "10.1.0.7")
    view.outbound[0].routes[0].match.path_regex = "/api/.*"
    found = inputs.split(view)

    await control_plane.apply({"ns1/app1": found.policy}, found.slices)

    after = current(cache, key)
    assert control_plane.policies["ns1/app1"] is found.policy
    assert after.version_of(ROUTE) != before.version_of(ROUTE)
    assert addresses_of(after) == ["10.1.0.7"]
    assert after.version.startswith(f"{found.policy.version}/")


# -- slices that go ------------------------------------------------------------------------


async def test_a_removed_slice_empties_its_clusters_endpoints(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1)

    await control_plane.apply({}, {SLICE: None})

    after = current(cache, key)
    assert SLICE not in control_plane.slices
    assert addresses_of(after) == []  # still there, empty: the EDS cluster is not warming
    assert after.consistent() == []
    view = control_plane.view("ns1/app1")
    assert view is not None
    assert list(view.clusters[0].endpoints) == []

    await control_plane.apply({}, {SLICE: new_slice("10.1.0.3")})  # back again

    assert addresses_of(current(cache, key)) == ["10.1.0.3"]


async def test_a_slice_no_held_policy_names_is_not_kept(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    key = await attach(control_plane, sources, 1)
    before = current(cache, key)
    stranger = pb.ClusterSlice(cluster="mesh/other|80", version="v1")

    await control_plane.apply({}, {"slice/mesh/other|80": stranger})

    assert list(control_plane.slices) == [SLICE]
    assert current(cache, key) is before


async def test_the_last_holders_detach_forgets_its_slice(
    control_plane: ProxyControlPlane, sources: t.FakeSources
) -> None:
    first = await attach(control_plane, sources, 1)
    second = await attach(control_plane, sources, 2)

    control_plane.detach(t.proxy_common_name("app1", "ns1", 1), first)
    assert list(control_plane.slices) == [SLICE]  # the second still names it
    control_plane.detach(t.proxy_common_name("app2", "ns2", 2), second)

    assert control_plane.slices == {}
    assert control_plane.policies == {}
