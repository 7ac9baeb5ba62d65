"""EDS: load assignments by locality, kept by the catalog's content of the cluster."""

from __future__ import annotations

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.translate.endpoints import LoadAssignments
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.settings import ProxySettings

BASE = [("10.0.0.1", 8080, 1, "eu/a"), ("10.0.0.2", 8080, 1, "eu/a")]


def cluster(*members: tuple[str, int, int, str], name: str = "shop/api|80") -> catalog_pb2.Cluster:
    return catalog_pb2.Cluster(
        name=name,
        discovery="EDS",
        endpoints=[
            catalog_pb2.ClusterEndpoint(address=a, port=p, weight=w, locality=loc)
            for a, p, w, loc in members
        ],
    )


def hosts(assignment: endpoint_pb2.ClusterLoadAssignment) -> list[tuple[str, str, int, int]]:
    return [
        (
            group.locality.zone,
            lb.endpoint.address.socket_address.address,
            lb.endpoint.address.socket_address.port_value,
            lb.load_balancing_weight.value,
        )
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    ]


def test_endpoints_grouped_by_locality_sorted_with_weights() -> None:
    found = LoadAssignments()(
        cluster(
            ("10.0.0.2", 8080, 0, "eu/b"),
            ("10.0.0.1", 8080, 3, "eu/a"),
            ("10.0.0.3", 8080, 2, "eu/b"),
        )
    )
    assert found.cluster_name == "shop/api|80"
    assert hosts(found) == [
        ("a", "10.0.0.1", 8080, 3),
        ("b", "10.0.0.2", 8080, 1),  # weight 0 is weight 1
        ("b", "10.0.0.3", 8080, 2),
    ]
    assert [g.load_balancing_weight.value for g in found.endpoints] == [3, 3]


def test_a_moved_endpoint_is_seen_and_the_same_content_is_shared() -> None:
    """Kept by content: a cluster that differs in one weight is its own assignment, and
    an equal cluster parsed anew (as the next view brings it) gets the same one; of a
    changed cluster, only the changed endpoint's message is built again."""
    assignments = LoadAssignments()
    first = assignments(cluster(*BASE))
    assert assignments.endpoints_built == 2
    again = assignments(catalog_pb2.Cluster.FromString(cluster(*BASE).SerializeToString()))
    assert again is first
    assert assignments.endpoints_built == 2
    moved = assignments(cluster(BASE[0], ("10.0.0.2", 8080, 5, "eu/a")))
    assert hosts(moved)[1] == ("a", "10.0.0.2", 8080, 5)
    assert hosts(first)[1] == ("a", "10.0.0.2", 8080, 1)  # the kept one was not changed
    assert assignments.endpoints_built == 3
    port = assignments(cluster(BASE[0], ("10.0.0.2", 9090, 1, "eu/a")))
    assert hosts(port)[1] == ("a", "10.0.0.2", 9090, 1)
    assert assignments.endpoints_built == 4
    assert port == LoadAssignments()(cluster(BASE[0], ("10.0.0.2", 9090, 1, "eu/a")))


def test_reuse_gives_what_a_build_from_nothing_gives() -> None:
    assignments = LoadAssignments()
    steps = [
        cluster(*BASE),
        cluster(BASE[0], ("10.0.0.2", 8080, 5, "eu/a"), ("10.0.0.3", 8080, 1, "eu/b")),
        cluster(("10.0.0.3", 8080, 1, "eu/b"), BASE[0]),
        cluster(),
        cluster(*BASE),
    ]
    for step in steps:
        assert assignments(step) == LoadAssignments()(step)


def test_two_objects_share_nothing() -> None:
    one, other = LoadAssignments(), LoadAssignments()
    first = one(cluster(*BASE))
    found = other(cluster(*BASE))
    assert found == first
    assert found is not first
    assert (one.endpoints_built, other.endpoints_built) == (2, 2)
    one(cluster(*BASE, name="shop/web|80"))
    assert (len(one), len(other)) == (2, 1)


def test_past_the_kept_names_everything_is_forgotten_at_once() -> None:
    assignments = LoadAssignments(kept_clusters=2)
    first = assignments(cluster(*BASE, name="a"))
    assignments(cluster(*BASE, name="b"))
    assert len(assignments) == 2
    assignments(cluster(*BASE, name="c"))
    assert len(assignments) == 1
    built = assignments.endpoints_built
    again = assignments(cluster(*BASE, name="a"))
    assert again is not first
    assert again == first
    assert assignments.endpoints_built == built + 2  # its endpoints were forgotten too


def test_a_views_assignments_are_its_eds_clusters_in_order() -> None:
    assignments = LoadAssignments()
    dns = catalog_pb2.Cluster(name="dns", discovery="DNS")
    passthrough = catalog_pb2.Cluster(name="out", discovery="PASSTHROUGH")
    view = catalog_pb2.View(
        clusters=[cluster(*BASE, name="b"), dns, passthrough, cluster(*BASE, name="a")]
    )
    found = assignments.of_view(view)
    assert [a.cluster_name for a in found] == ["b", "a"]
    assert found[1] is assignments(cluster(*BASE, name="a"))


@pytest.mark.parametrize("settings", [ProxySettings(), ProxySettings(proxyless=True)])
def test_translate_keeps_assignments_only_in_the_object_it_is_given(
    settings: ProxySettings,
) -> None:
    view = t.view(endpoints=("10.0.0.1", "10.0.0.2"))
    first = translate(view, settings, None).endpoints
    again = translate(view, settings, None).endpoints
    assert len(first) == len(again) == 1
    assert again == first
    assert again[0] is not first[0]  # nothing kept between calls

    assignments = LoadAssignments()
    kept = translate(view, settings, None, assignments).endpoints
    assert translate(view, settings, None, assignments).endpoints[0] is kept[0]
    assert kept == first
    assert len(assignments) == 1


def test_the_encoding_is_what_protobuf_writes_for_the_message() -> None:
    """``encode`` joins kept bytes, so its layout is its own: it must be the message's
    deterministic serialization, field for field in number order (a version is a digest
    of these bytes), localities, weights and failover priorities included."""
    members = (("10.0.0.2", 8080, 0, "eu/b"), ("10.0.0.1", 8080, 3, "eu/a"), *BASE)
    for locality, wanted in (("", [0, 0]), ("eu/a", [0, 1]), ("eu/b/c", [1, 0])):
        encoded = LoadAssignments().encode("shop/api|80", cluster(*members).endpoints, locality)
        parsed = endpoint_pb2.ClusterLoadAssignment.FromString(encoded)
        assert encoded == parsed.SerializeToString(deterministic=True)
        assert parsed.cluster_name == "shop/api|80"
        assert [g.locality.zone for g in parsed.endpoints] == ["a", "b"]
        assert [g.priority for g in parsed.endpoints] == wanted  # the proxy's zone first
    assert LoadAssignments().encode("shop/none|80", [], "") == (
        endpoint_pb2.ClusterLoadAssignment(cluster_name="shop/none|80").SerializeToString()
    )
