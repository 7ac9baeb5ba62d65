"""EDS: load assignments by locality, kept by the catalog's content of the cluster."""

from __future__ import annotations

from envoy.config.endpoint.v3 import endpoint_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import endpoints


def cluster(*members: tuple[str, int, int, str]) -> catalog_pb2.Cluster:
    return catalog_pb2.Cluster(
        name="shop/api|80",
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
    found = endpoints.load_assignment(
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
    an equal cluster parsed anew (as the next view brings it) gets the same one."""
    base = [("10.0.0.1", 8080, 1, "eu/a"), ("10.0.0.2", 8080, 1, "eu/a")]
    first = endpoints.load_assignment(cluster(*base))
    again = endpoints.load_assignment(
        catalog_pb2.Cluster.FromString(cluster(*base).SerializeToString())
    )
    assert again is first
    moved = endpoints.load_assignment(cluster(base[0], ("10.0.0.2", 8080, 5, "eu/a")))
    assert hosts(moved)[1] == ("a", "10.0.0.2", 8080, 5)
    assert hosts(first)[1] == ("a", "10.0.0.2", 8080, 1)  # the kept one was not changed
    port = endpoints.load_assignment(cluster(base[0], ("10.0.0.2", 9090, 1, "eu/a")))
    assert hosts(port)[1] == ("a", "10.0.0.2", 9090, 1)
