"""Locality failover: EDS priorities relative to the proxy's locality (Istio's rule), only
where MeshConfig turns it on and for clusters with outlier detection, kept per (cluster,
proxy locality); the proxy's locality read from its node and part of its snapshot key."""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import struct_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.authorizer import MeshAuthorizer
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate import locality
from trellis_proxy_cp.translate.endpoints import LoadAssignments, fails_over
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, ProxySettings, from_metadata
from trellis_proxy_cp.transport.streams import StreamRefused

# one endpoint per locality: nearest first as the proxy in eu/a/1 sees them
SAME = ("10.0.0.1", "eu/a/1")
SAME_ZONE = ("10.0.0.2", "eu/a/2")
SAME_REGION = ("10.0.0.3", "eu/b/1")
ELSEWHERE = ("10.0.0.4", "us/a/1")
NO_LOCALITY = ("10.0.0.5", "")


def cluster(
    *members: tuple[str, str], outliers: bool = True, discovery: str = "STATIC"
) -> catalog_pb2.Cluster:
    source = catalog_pb2.Cluster(
        name="shop/api|80",
        discovery=discovery,
        endpoints=[
            catalog_pb2.ClusterEndpoint(address=a, port=8080, weight=1, locality=loc)
            for a, loc in members
        ],
    )
    if outliers:
        source.connection.outlier_detection.consecutive_5xx = 2
    else:
        source.connection.max_connections = 10  # connection settings, no outlier detection
    return source


def priorities(assignment: endpoint_pb2.ClusterLoadAssignment) -> dict[str, int]:
    """Each endpoint's address and its locality's priority."""
    return {
        lb.endpoint.address.socket_address.address: group.priority
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    }


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("eu/a/1", 0),
        ("eu/a/2", 1),
        ("eu/a", 1),
        ("eu/b/1", 2),
        ("eu", 2),
        ("us/a/1", 3),
        ("", 3),
    ],
)
def test_istios_priority_of_an_endpoint_locality(endpoint: str, expected: int) -> None:
    assert locality.priority(locality.parts("eu/a/1"), locality.parts(endpoint)) == expected


def test_a_proxy_without_a_subzone_matches_endpoints_without_one_first() -> None:
    assert locality.priorities("eu/a", ["eu/a", "eu/a/1", "eu/b"]) == {
        "eu/a": 0,
        "eu/a/1": 1,
        "eu/b": 2,
    }


def test_priorities_are_contiguous_from_zero() -> None:
    """Envoy's priorities run 0..N without gaps: the levels in use are ranked."""
    assert locality.priorities("eu/a/1", ["us/x", "eu/b/1", "eu/b/2"]) == {
        "us/x": 1,
        "eu/b/1": 0,
        "eu/b/2": 0,
    }
    assert locality.priorities("eu/a/1", ["us/x"]) == {"us/x": 0}
    assert locality.priorities("eu/a/1", []) == {}


def test_the_nodes_locality_as_text() -> None:
    assert locality.of_node(base_pb2.Locality(region="eu", zone="a", sub_zone="1")) == "eu/a/1"
    assert locality.of_node(base_pb2.Locality(region="eu", zone="a")) == "eu/a"
    assert locality.of_node(base_pb2.Locality(region="eu")) == "eu"
    assert locality.of_node(base_pb2.Locality()) == ""
    with pytest.raises(InvalidNodeMetadata, match=r"node\.locality\.zone: 'a/b' must not"):
        locality.of_node(base_pb2.Locality(region="eu", zone="a/b"))


def test_failover_only_with_outlier_detection_on_eds_clusters() -> None:
    assert fails_over(cluster(SAME))
    assert not fails_over(cluster(SAME, outliers=False))
    assert not fails_over(catalog_pb2.Cluster(name="x", discovery="STATIC"))
    assert not fails_over(cluster(SAME, discovery="DNS"))


def test_the_proxy_prefers_its_own_locality_and_fails_over_outward() -> None:
    source = cluster(ELSEWHERE, SAME_REGION, SAME, NO_LOCALITY, SAME_ZONE)

    found = LoadAssignments()(source, "eu/a/1")

    assert priorities(found) == {
        "10.0.0.1": 0,
        "10.0.0.2": 1,
        "10.0.0.3": 2,
        "10.0.0.4": 3,
        "10.0.0.5": 3,
    }
    # weights and localities as without failover
    assert all(g.load_balancing_weight.value == 1 for g in found.endpoints)
    assert {g.locality.zone for g in found.endpoints} == {"a", "b", ""}


def test_each_locality_sees_its_own_side_first() -> None:
    source = cluster(("10.0.0.1", "eu/a"), ("10.0.0.2", "eu/b"))
    assignments = LoadAssignments()

    assert priorities(assignments(source, "eu/a")) == {"10.0.0.1": 0, "10.0.0.2": 1}
    assert priorities(assignments(source, "eu/b")) == {"10.0.0.1": 1, "10.0.0.2": 0}


def test_without_outlier_detection_or_a_proxy_locality_everything_is_priority_zero() -> None:
    assignments = LoadAssignments()
    plain = cluster(SAME, ELSEWHERE, outliers=False)
    detected = cluster(SAME, ELSEWHERE)

    assert set(priorities(assignments(plain, "eu/a/1")).values()) == {0}
    assert set(priorities(assignments(detected)).values()) == {0}
    # a cluster that does not fail over is one assignment, whatever the proxy's locality
    assert assignments(plain, "eu/a/1") is assignments(plain, "us/x") is assignments(plain)


def test_kept_per_cluster_and_proxy_locality_not_per_proxy() -> None:
    assignments = LoadAssignments()
    source = cluster(SAME, ELSEWHERE)

    first = assignments(source, "eu/a/1")
    again = assignments(catalog_pb2.Cluster.FromString(source.SerializeToString()), "eu/a/1")
    other = assignments(source, "us/a/1")

    assert again is first  # every proxy of one locality shares it
    assert other is not first
    assert len(assignments) == 2
    # a moved endpoint rebuilds each locality's assignment
    moved = cluster(SAME, ("10.0.0.9", "us/a/1"))
    assert priorities(assignments(moved, "eu/a/1")) == {"10.0.0.1": 0, "10.0.0.9": 1}
    assert len(assignments) == 2


def test_translate_gives_a_sidecar_its_localitys_priorities() -> None:
    view = catalog_pb2.View(version="1", clusters=[cluster(SAME, ELSEWHERE)])
    view.mesh.locality_failover = True  # MeshConfig traffic.enableLocalityFailover

    here = translate(view, ProxySettings(locality="eu/a/1"), None).endpoints
    there = translate(view, ProxySettings(locality="us/a/1"), None).endpoints
    unknown = translate(view, ProxySettings(), None).endpoints

    assert [priorities(cast("endpoint_pb2.ClusterLoadAssignment", m)) for m in here] == [
        {"10.0.0.1": 0, "10.0.0.4": 1}
    ]
    assert [priorities(cast("endpoint_pb2.ClusterLoadAssignment", m)) for m in there] == [
        {"10.0.0.1": 1, "10.0.0.4": 0}
    ]
    assert [priorities(cast("endpoint_pb2.ClusterLoadAssignment", m)) for m in unknown] == [
        {"10.0.0.1": 0, "10.0.0.4": 0}
    ]


def test_off_mesh_wide_unless_meshconfig_turns_it_on() -> None:
    view = catalog_pb2.View(version="1", clusters=[cluster(SAME, ELSEWHERE)])
    assignments = LoadAssignments()

    [off] = assignments.of_view(view, "us/a/1")
    view.mesh.locality_failover = True
    [on] = assignments.of_view(view, "us/a/1")

    assert priorities(off) == {"10.0.0.1": 0, "10.0.0.4": 0}
    assert off is assignments(view.clusters[0])  # the one every proxy gets
    assert priorities(on) == {"10.0.0.1": 1, "10.0.0.4": 0}


def test_the_locality_is_part_of_the_snapshot_key_except_for_proxyless_clients() -> None:
    assert ProxySettings(locality="eu/a").key() == ProxySettings().key() + "|locality:eu/a"
    assert from_metadata({}, "eu/a").locality == "eu/a"
    proxyless = from_metadata({"trellis": {"proxyless": True}}, "eu/a")
    assert proxyless.locality == ""
    assert proxyless.key() == "proxyless"


# --- the authorizer reads node.locality ------------------------------------------------------

PROXY = t.proxy_common_name("bookstore", "bookstore", 1)
SERIAL = 0xC0FFEE


class _Context:
    """What the authorizer reads of a ``grpc.aio.ServicerContext`` after an mTLS handshake."""

    def __init__(self) -> None:
        pem = t.peer_certificate_pem(PROXY, SERIAL, dt.timedelta(minutes=5))
        self._auth = {"x509_common_name": [PROXY.encode()], "x509_pem_cert": [pem]}

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


async def _expected(
    common_name: str, serial: str = "", *, onboarding: bool = False
) -> Expectation | None:
    return Expectation("bookstore", f"{SERIAL:x}") if common_name == PROXY else None


def _node(where: base_pb2.Locality) -> base_pb2.Node:
    metadata = struct_pb2.Struct()
    metadata.update({"trellis": {"workload_dir": "/etc/trellis/proxy"}})
    return base_pb2.Node(id=PROXY, cluster="bookstore", metadata=metadata, locality=where)


def _authorizer() -> tuple[MeshAuthorizer, ProxyControlPlane]:
    control_plane = t.FakeSources().control_plane(SnapshotCache())
    return MeshAuthorizer(control_plane, _expected, RevokedSerials()), control_plane


async def test_the_stream_joins_the_group_of_its_nodes_locality() -> None:
    authorizer, control_plane = _authorizer()
    context = cast("grpc.aio.ServicerContext[Any, Any]", _Context())

    stream = await authorizer.authorize(
        context, _node(base_pb2.Locality(region="eu", zone="a", sub_zone="1"))
    )

    settings = ProxySettings(workload_dir="/etc/trellis/proxy", locality="eu/a/1")
    assert stream.key == ProxyControlPlane.key_of("bookstore/bookstore", settings)
    assert control_plane.groups[stream.key].settings.locality == "eu/a/1"


async def test_a_node_locality_with_a_slash_is_an_invalid_argument_naming_the_field() -> None:
    authorizer, control_plane = _authorizer()
    context = cast("grpc.aio.ServicerContext[Any, Any]", _Context())

    with pytest.raises(StreamRefused) as caught:
        await authorizer.authorize(context, _node(base_pb2.Locality(region="eu/west")))

    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "node.locality.region" in caught.value.message
    assert control_plane.groups == {}
