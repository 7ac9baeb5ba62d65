"""Istio ServiceEntry clusters: resolution as Envoy cluster types, ``unix://`` endpoints,
``subjectAltNames``; each checked on the resources and, where Envoy reads them, by Envoy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import as_dict, cluster, self_signed_material, static_bootstrap
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy

SPIFFE = "spiffe://cluster.local/ns/shop/sa/db"
SOCKET = "unix:///var/run/trellis-test/db.sock"


def view(*clusters: pb.Cluster) -> pb.View:
    return pb.View(
        identity="shop/client",
        namespace="shop",
        service="client",
        service_account="client",
        spiffe_id="spiffe://cluster.local/ns/shop/sa/client",
        version="1",
        mesh=pb.MeshSettings(trust_domain="cluster.local"),
        clusters=list(clusters),
    )


SIDECAR = ProxySettings()


def clusters_of(source: pb.View, settings: ProxySettings = SIDECAR) -> dict[str, Any]:
    resources = translate(source, settings, self_signed_material())
    return {c["name"]: c for c in map(as_dict, resources.clusters)}


def accepted(source: pb.View, settings: ProxySettings) -> None:
    """``envoy --mode validate`` takes the sidecar's resources (``settings``: the
    ``sidecar`` fixture's, with real certificate files)."""
    resources = translate(source, settings, self_signed_material())
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dns_is_strict_and_dns_round_robin_is_logical_dns(
    sidecar: Callable[..., ProxySettings],
) -> None:
    strict = cluster("shop/api|443", ("api.example.com", 443), discovery="DNS", mesh_tls=False)
    logical = cluster(
        "shop/one|443", ("one.example.com", 443), discovery="LOGICAL_DNS", mesh_tls=False
    )
    # an entry of several hosts and no endpoints: one cluster of two names, which
    # LOGICAL_DNS cannot take (Envoy: exactly one endpoint)
    merged = cluster(
        "shop/two|443",
        ("a.example.com", 443),
        ("b.example.com", 443),
        discovery="LOGICAL_DNS",
        mesh_tls=False,
    )
    source = view(strict, logical, merged)
    found = clusters_of(source)
    assert found["shop/api|443"]["type"] == "STRICT_DNS"
    assert found["shop/one|443"]["type"] == "LOGICAL_DNS"
    [group] = found["shop/one|443"]["load_assignment"]["endpoints"]
    [member] = group["lb_endpoints"]
    address = member["endpoint"]["address"]["socket_address"]
    assert address == {"address": "one.example.com", "port_value": 443}
    assert found["shop/two|443"]["type"] == "STRICT_DNS"
    accepted(source, sidecar())


def test_a_unix_endpoint_is_a_pipe_for_a_sidecar_and_left_out_for_grpc(
    sidecar: Callable[..., ProxySettings],
) -> None:
    entry = cluster("shop/db|5432", ("10.0.0.7", 5432), protocol="tcp")
    entry.endpoints.append(pb.ClusterEndpoint(address=SOCKET, port=5432, weight=1))
    other = cluster("shop/api|80", ("10.0.0.8", 8080))
    source = view(entry, other)

    resources = translate(source, ProxySettings(), self_signed_material())
    loads = {e["cluster_name"]: e for e in map(as_dict, resources.endpoints)}
    addresses = [
        lb["endpoint"]["address"]
        for group in loads["shop/db|5432"]["endpoints"]
        for lb in group["lb_endpoints"]
    ]
    assert {"pipe": {"path": "/var/run/trellis-test/db.sock"}} in addresses
    assert {"socket_address": {"address": "10.0.0.7", "port_value": 5432}} in addresses
    accepted(source, sidecar())  # Envoy takes the pipe: nothing else in the update is refused

    grpc = translate(source, ProxySettings(proxyless=True), self_signed_material())
    grpc_loads = {e["cluster_name"]: e for e in map(as_dict, grpc.endpoints)}
    served = [
        lb["endpoint"]["address"]
        for group in grpc_loads["shop/db|5432"]["endpoints"]
        for lb in group["lb_endpoints"]
    ]
    assert served == [{"socket_address": {"address": "10.0.0.7", "port_value": 5432}}]
    # the sidecars' assignment (shared) still has its pipe
    again = translate(source, ProxySettings(), self_signed_material())
    assert {e["cluster_name"]: e for e in map(as_dict, again.endpoints)} == loads


def test_subject_alt_names_of_a_mesh_internal_entry_are_enforced(
    sidecar: Callable[..., ProxySettings],
) -> None:
    internal = cluster("shop/db|5432", ("10.0.0.7", 5432), protocol="grpc", spiffe=SPIFFE)
    internal.subject_alt_names.extend(
        ["db.internal.example", "spiffe://other.domain/ns/x/sa/y", "10.0.0.7"]
    )
    source = view(internal)
    tls = clusters_of(source)["shop/db|5432"]["transport_socket"]["typed_config"]
    validation = tls["common_tls_context"]["combined_validation_context"]
    assert validation["default_validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "URI", "matcher": {"exact": SPIFFE}},
        {"san_type": "DNS", "matcher": {"exact": "db.internal.example"}},
        {"san_type": "URI", "matcher": {"exact": "spiffe://other.domain/ns/x/sa/y"}},
        {"san_type": "IP_ADDRESS", "matcher": {"exact": "10.0.0.7"}},
    ]
    accepted(source, sidecar())

    grpc = clusters_of(source, ProxySettings(proxyless=True))["shop/db|5432"]
    context = grpc["transport_socket"]["typed_config"]["common_tls_context"]
    assert context["validation_context"]["match_subject_alt_names"] == [
        {"exact": SPIFFE},
        {"exact": "db.internal.example"},
        {"exact": "spiffe://other.domain/ns/x/sa/y"},
        {"exact": "10.0.0.7"},
    ]


def test_an_external_entry_has_no_tls_to_check_names_on() -> None:
    external = cluster("shop/api|443", ("192.0.2.1", 443), mesh_tls=False)
    external.subject_alt_names.append("api.example.com")
    assert "transport_socket" not in clusters_of(view(external))["shop/api|443"]


def test_outlier_detection_turns_on_locality_weighted_balancing(
    sidecar: Callable[..., ProxySettings],
) -> None:
    """Endpoints in two localities; outlier detection from an UpstreamTrafficSetting."""
    zoned = cluster("shop/db|5432", ("10.0.0.7", 5432), ("10.0.1.7", 5432), protocol="tcp")
    zoned.endpoints[1].locality = "eu/east"
    zoned.connection.CopyFrom(
        pb.ConnectionSettings(
            policy="shop/db", outlier_detection=pb.OutlierDetection(consecutive_5xx=3)
        )
    )
    plain = cluster("shop/api|80", ("10.0.0.8", 8080))
    dns = cluster("shop/ext|443", ("api.example.com", 443), discovery="DNS", mesh_tls=False)
    dns.connection.CopyFrom(zoned.connection)
    source = view(zoned, plain, dns)
    found = clusters_of(source)
    assert found["shop/db|5432"]["common_lb_config"] == {"locality_weighted_lb_config": {}}
    assert "common_lb_config" not in found["shop/api|80"]  # no outlier detection: off
    assert "common_lb_config" not in found["shop/ext|443"]  # one inline locality
    resources = translate(source, SIDECAR, self_signed_material())
    [load] = [e for e in map(as_dict, resources.endpoints) if e["cluster_name"] == "shop/db|5432"]
    weights = {
        group["locality"]["zone"]: group["load_balancing_weight"] for group in load["endpoints"]
    }
    assert weights == {"west": 1, "east": 1}
    accepted(source, sidecar())
