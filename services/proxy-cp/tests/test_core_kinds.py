"""A policy change rebuilds the kinds of resource it concerns, and no others.

:data:`~trellis_proxy_cp.translate.scope.READS` says which fields of a policy each kind's
translators read; a group whose policy changed translates only the kinds that read a field
that moved, and keeps the very resources of the others. The table is checked against the
translators themselves: for every pair of the translation tests' views and every field,
the first view with that field taken from the second gives, built by a change, exactly
what a whole build of it gives. Real :class:`SnapshotCache` and real translation, fed by
:class:`~trellis_proxy_cp.testing.FakeSources`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.metrics import XdsMetrics
from trellis_proxy_cp.rebuilds import TYPE_OF_KIND
from trellis_proxy_cp.translate import scope
from trellis_proxy_cp.translate.proxy import KINDS
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, TypeUrl

from . import test_translate, test_translate_capture, test_translate_edge

CAPTURE = dataclasses.replace(t.SIDECAR, capture=True)
PROXY = t.proxy_common_name("app", "ns")


def failover_view() -> pb.View:
    """An upstream whose endpoints are in two localities, with failover on mesh-wide."""
    view = t.view(endpoints=("10.0.0.1", "10.0.0.2"))
    view.mesh.locality_failover = True
    view.clusters[0].connection.outlier_detection.consecutive_5xx = 5
    for endpoint, locality in zip(view.clusters[0].endpoints, ("r1/z1", "r1/z2"), strict=True):
        endpoint.locality = locality
    return view


#: Views of every shape the translation tests know: HTTP and TCP inbound, permissive,
#: egress and TCP destinations, captured pods, ServiceEntries and IngressBackends.
VIEWS: dict[str, Callable[[], pb.View]] = {
    "http": test_translate.store_view,
    "tcp": lambda: test_translate.store_view("tcp"),
    "permissive": lambda: test_translate.store_view(rules=False, permissive=True),
    "egress-tcp": test_translate.egress_tcp_view,
    "captured": lambda: test_translate_capture.captured_view(egress=True),
    "captured-store": test_translate_capture.store_view,
    "egress": test_translate_edge.egress_view,
    "ingress": lambda: test_translate_edge.ingress_view("http"),
    "upstream": t.view,
    "failover": failover_view,
}

#: The fields a change may move (the identity's own never move for one identity).
FIELDS = sorted(
    f.name
    for f in pb.View.DESCRIPTOR.fields
    if f.name not in scope.UNREAD | {"identity", "namespace", "service", "service_account",
                                     "spiffe_id"}
)  # fmt: skip


def _weights(view: pb.View, service: pb.OutboundService) -> None:
    for route in service.routes:
        for position, weighted in enumerate(route.clusters):
            weighted.weight = 10 + 37 * position


def _match(view: pb.View, service: pb.OutboundService) -> None:
    for route in service.routes:
        route.match.path_regex = "/moved/.*"
        route.match.methods[:] = ["GET"]


def _retry(view: pb.View, service: pb.OutboundService) -> None:
    service.retry.retry_on = "5xx"
    service.retry.num_retries = 3


def _no_routes(view: pb.View, service: pb.OutboundService) -> None:
    del service.routes[:]


def _another_cluster(view: pb.View, service: pb.OutboundService) -> None:
    """The routes also send to the view's last cluster (a captured pod matches a
    destination without addresses on its clusters' endpoints)."""
    for route in service.routes:
        route.clusters.add(cluster=view.clusters[-1].name, weight=5)


#: What a route change does to one destination of a policy: the routes alone move (new
#: weights, matches, retries), or also what the listeners read (no routes left, or a
#: cluster named that was not).
ROUTE_CHANGES: dict[str, Callable[[pb.View, pb.OutboundService], None]] = {
    "weights": _weights,
    "match": _match,
    "retry": _retry,
    "no routes": _no_routes,
    "another cluster": _another_cluster,
}


def with_field(base: pb.View, donor: pb.View, name: str) -> pb.View:
    """``base`` with field ``name`` as ``donor`` has it, as ``base``'s identity."""
    changed = pb.View()
    changed.CopyFrom(base)
    changed.ClearField(name)  # type: ignore[arg-type]
    if pb.View.DESCRIPTOR.fields_by_name[name].is_repeated:
        getattr(changed, name).extend(getattr(donor, name))
    elif donor.HasField(name):  # type: ignore[arg-type]
        getattr(changed, name).CopyFrom(getattr(donor, name))
    changed.version = "changed"
    return changed


async def snapshot_of(
    settings: ProxySettings, first: pb.View, then: pb.View | None = None
) -> tuple[Snapshot | None, ProxyControlPlane]:
    """The group's snapshot built from ``first``, then changed to ``then`` (if given)."""
    sources = t.FakeSources()
    cache = SnapshotCache()
    control_plane = sources.control_plane(cache)
    identity = first.identity
    sources.views[identity] = first
    key = await control_plane.attach(PROXY, identity, first.service_account, settings)
    if then is not None:
        await control_plane.set_view(identity, then)
    return cache.get(key), control_plane


def versions(snapshot: Snapshot | None) -> dict[str, dict[str, str]] | None:
    if snapshot is None:
        return None
    return {
        type_url: {name: r.version for name, r in snapshot.of_type(type_url).items()}
        for type_url in (LISTENER, ROUTE, CLUSTER, ENDPOINT, SECRET)
    }


@pytest.mark.parametrize(
    "settings",
    [t.SIDECAR, CAPTURE, dataclasses.replace(t.SIDECAR, locality="r1/z1")],
    ids=["sidecar", "captured", "located"],
)
async def test_a_change_builds_what_a_whole_build_of_the_new_policy_builds(
    settings: ProxySettings,
) -> None:
    compared = partial = routes_only = 0
    for (base_name, base), (donor_name, donor) in itertools.permutations(VIEWS.items(), 2):
        for name in FIELDS:
            before, changed = base(), with_field(base(), donor(), name)
            if getattr(before, name) == getattr(changed, name):
                continue
            whole, _ = await snapshot_of(settings, changed)
            built, control_plane = await snapshot_of(settings, before, changed)
            group = next(iter(control_plane.groups.values()))
            if whole is None:  # a mix no snapshot can hold: refused both ways
                assert group.last_error, (base_name, donor_name, name)
                continue
            assert versions(built) == versions(whole), (base_name, donor_name, name)
            compared += 1
            partial += scope.kinds_concerned(before, changed, settings) != KINDS
    for (base_name, base), (change, move) in itertools.product(
        VIEWS.items(), ROUTE_CHANGES.items()
    ):
        for position in range(len(base().outbound)):
            before, changed = base(), base()
            move(changed, changed.outbound[position])
            changed.version = "changed"
            if before == changed:
                continue
            whole, _ = await snapshot_of(settings, changed)
            built, control_plane = await snapshot_of(settings, before, changed)
            group = next(iter(control_plane.groups.values()))
            if whole is None:
                assert group.last_error, (base_name, change, position)
                continue
            assert versions(built) == versions(whole), (base_name, change, position)
            compared += 1
            routes_only += scope.kinds_concerned(before, changed, settings) == {"routes"}
    assert compared > 200  # the check covers many changes, most of them partial
    assert partial > compared / 2
    assert routes_only > 10


async def attached(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache, view: pb.View
) -> tuple[str, Snapshot]:
    """A sidecar of ``view``'s identity attached: its key and first snapshot (the count of
    kinds built starts after it)."""
    sources.views[view.identity] = view
    key = await control_plane.attach(PROXY, view.identity, view.service_account, t.SIDECAR)
    snapshot = cache.get(key)
    assert snapshot is not None
    control_plane.kinds_built.clear()
    return key, snapshot


def assert_kept(before: Snapshot, after: Snapshot, *type_urls: TypeUrl) -> None:
    """The resources of ``type_urls`` are the very objects they were."""
    assert any(after.of_type(type_url) for type_url in type_urls)
    for type_url in type_urls:
        assert after.of_type(type_url).keys() == before.of_type(type_url).keys()
        for name, resource in after.of_type(type_url).items():
            assert resource is before.of_type(type_url)[name], (type_url, name)


async def test_new_routes_rebuild_the_routes_and_keep_the_rest(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """An HTTPRouteGroup's new match (or a TrafficSplit's weights) moves ``outbound``."""
    view = t.view()
    key, before = await attached(control_plane, sources, cache, view)

    moved = pb.View()
    moved.CopyFrom(view)
    moved.outbound[0].routes[0].match.path_regex = "/books/.*"
    moved.version = "routes"
    await control_plane.set_view(view.identity, moved)

    after = cache.get(key)
    assert after is not None
    assert after is not before
    assert control_plane.kinds_built == {"routes": 1}
    assert after.version_of(ROUTE) != before.version_of(ROUTE)
    assert_kept(before, after, *(TYPE_OF_KIND[k] for k in sorted(KINDS - {"routes"})))


async def test_new_material_rebuilds_the_secrets_only(
    sources: t.FakeSources, cache: SnapshotCache
) -> None:
    """A rotated certificate is read by the secrets alone; the metric counts the kinds."""
    registry = CollectorRegistry()
    metrics = XdsMetrics(registry)
    control_plane = ProxyControlPlane(
        cache, sources.fetch_inputs, sources.fetch_material, on_built=metrics.translated
    )
    view = test_translate.store_view()
    key, before = await attached(control_plane, sources, cache, view)

    await control_plane.set_material(view.identity, t.material(serial="s2"))

    after = cache.get(key)
    assert after is not None
    assert control_plane.kinds_built == {"secrets": 1}
    assert after.version.endswith("/s2")
    assert_kept(before, after, LISTENER, ROUTE, CLUSTER, ENDPOINT)
    counted = {
        kind: registry.get_sample_value("trellis_proxy_cp_translations_total", {"kind": kind})
        for kind in sorted(KINDS)
    }
    assert counted == {"clusters": 1, "endpoints": 1, "listeners": 1, "routes": 1, "secrets": 2}


async def test_a_proxyless_client_is_rebuilt_whole(
    control_plane: ProxyControlPlane, sources: t.FakeSources, cache: SnapshotCache
) -> None:
    view = test_translate.store_view()
    sources.views[view.identity] = view
    proxyless = ProxySettings(proxyless=True)
    await control_plane.attach(PROXY, view.identity, view.service_account, proxyless)
    control_plane.kinds_built.clear()

    await control_plane.set_material(view.identity, t.material(serial="s2"))

    assert control_plane.kinds_built == dict.fromkeys(KINDS, 1)
