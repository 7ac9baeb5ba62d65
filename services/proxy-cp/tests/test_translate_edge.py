"""OSM Egress and IngressBackend as Envoy resources: golden virtual hosts, clusters and filter
chains, and Envoy's verdict on them."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import as_dict, static_bootstrap
from trellis_proxy_cp.translate import egress, names
from trellis_proxy_cp.translate.proxy import Resources, translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy

CONNECT = {
    "upgrade_configs": [{"upgrade_type": "CONNECT", "connect_config": {}}],
    "timeout": "0s",
}


def policies(*names: str) -> dict[str, Any]:
    """The metadata naming the Egress policies that allow a route."""
    return {"filter_metadata": {"trellis": {"policies": list(names)}}}


def egress_view() -> pb.View:
    return pb.View(
        identity="curl/curl",
        namespace="curl",
        service="curl",
        egress=[
            pb.EgressRoute(
                policies=["curl/httpbin"],
                protocol="http",
                port=80,
                host="httpbin.org",
                matches=[pb.HttpMatch(path_regex="/get", methods=["GET"])],
                connection=pb.ConnectionSettings(policy="curl/httpbin", max_requests=3),
            ),
            pb.EgressRoute(policies=["curl/tls"], protocol="https", port=443, host="example.com"),
            pb.EgressRoute(
                policies=["curl/db"], protocol="tcp", port=5432, ip_ranges=["10.0.0.0/30"]
            ),
        ],
    )


def _valid(resources: Resources) -> None:
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_egress_routes_are_virtual_hosts_per_host_and_port(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    resources = translate(egress_view(), sidecar(), real_material)
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.OUTBOUND_ROUTES)
    assert routes["virtual_hosts"] == [
        {
            "name": "egress/httpbin.org:80",
            "domains": ["httpbin.org:80", "httpbin.org"],
            "routes": [
                {
                    "name": "egress|http|httpbin.org:80|0",
                    "match": {
                        "safe_regex": {"regex": "/get"},
                        "headers": [{"name": ":method", "string_match": {"exact": "GET"}}],
                    },
                    "route": {"cluster": "egress|http|httpbin.org:80"},
                    "metadata": policies("curl/httpbin"),
                }
            ],
        },
        {
            "name": "egress/example.com:443",
            "domains": ["example.com:443"],
            "routes": [
                {
                    "name": "egress|https|example.com:443",
                    "match": {"connect_matcher": {}},
                    "route": {"cluster": "egress|https|example.com:443", **CONNECT},
                    "metadata": policies("curl/tls"),
                }
            ],
        },
        {
            "name": "egress/*:5432",
            "domains": ["*:5432"],
            "routes": [
                {
                    "name": "egress|tcp|*:5432",
                    "match": {
                        "connect_matcher": {},
                        "headers": [
                            {
                                "name": ":authority",
                                "string_match": {
                                    "safe_regex": {"regex": r"((10\.0\.0\.(0|1|2|3))):5432"}
                                },
                            }
                        ],
                    },
                    "route": {"cluster": "egress|tcp|*:5432", **CONNECT},
                    "metadata": policies("curl/db"),
                }
            ],
        },
    ]
    _valid(resources)


def test_egress_clusters_resolve_named_hosts_and_forward_address_ranges(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    resources = translate(egress_view(), sidecar(), real_material)
    clusters = {c["name"]: c for c in map(as_dict, resources.clusters)}
    http = clusters["egress|http|httpbin.org:80"]
    assert http["type"] == "STRICT_DNS"
    endpoint = http["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "httpbin.org", "port_value": 80}
    assert http["circuit_breakers"]["thresholds"][0]["max_requests"] == 3  # the setting's
    assert clusters["egress|https|example.com:443"]["type"] == "STRICT_DNS"
    tcp = clusters["egress|tcp|*:5432"]
    assert tcp["cluster_type"]["name"] == "envoy.clusters.dynamic_forward_proxy"
    outbound = next(x for x in map(as_dict, resources.listeners) if x["name"] == "outbound")
    manager = outbound["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in manager["http_filters"]] == [
        "envoy.filters.http.dynamic_forward_proxy",
        "envoy.filters.http.router",
    ]


def test_the_cidr_regex_takes_exactly_the_range() -> None:
    for cidr, inside, outside in (
        ("10.0.0.0/30", ["10.0.0.0", "10.0.0.3"], ["10.0.0.4", "10.0.0.30"]),
        ("192.168.4.0/22", ["192.168.4.1", "192.168.7.255"], ["192.168.8.0", "192.168.3.9"]),
        ("10.0.0.0/8", ["10.255.3.4"], ["11.0.0.1", "110.0.0.1"]),
        ("0.0.0.0/0", ["1.2.3.4"], []),
    ):
        pattern = re.compile(egress.cidr_regex(cidr))
        assert all(pattern.fullmatch(a) for a in inside), cidr
        assert not any(pattern.fullmatch(a) for a in outside), cidr


def ingress_view(protocol: str) -> pb.View:
    rule = pb.IngressRule(
        policy="bookstore/ingress",
        protocol=protocol,
        source_ranges=["10.0.0.0/8", "127.0.0.1/32"],
        principals=["nginx.ingress.cluster.local"] if protocol == "https" else [],
    )
    return pb.View(
        identity="bookstore/bookstore",
        namespace="bookstore",
        service="bookstore",
        inbound=[
            pb.InboundPort(port=14001, target_port=8081, protocol="http", name="http", ingress=rule)
        ],
    )


def test_an_http_ingress_backend_is_a_plaintext_chain_from_its_sources(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    resources = translate(ingress_view("http"), sidecar(), real_material)
    inbound = next(
        x for x in map(as_dict, resources.listeners) if x["name"] == names.INBOUND_LISTENER
    )
    assert [f["name"] for f in inbound["listener_filters"]] == [
        "envoy.filters.listener.tls_inspector"
    ]
    ingress, mesh = inbound["filter_chains"]
    assert ingress["name"] == "ingress|bookstore/ingress"
    assert ingress["filter_chain_match"] == {
        "transport_protocol": "raw_buffer",
        "source_prefix_ranges": [
            {"address_prefix": "10.0.0.0", "prefix_len": 8},
            {"address_prefix": "127.0.0.1", "prefix_len": 32},
        ],
    }
    assert "transport_socket" not in ingress
    manager = ingress["filters"][0]["typed_config"]
    # SANITIZE (the default, so not written): a client's x-forwarded-client-cert is dropped
    assert "forward_client_cert_details" not in manager
    [host] = manager["route_config"]["virtual_hosts"]
    assert host["routes"][0]["route"] == {"cluster": "inbound|14001"}
    assert "filter_chain_match" not in mesh  # the mesh's mTLS chain, as without the policy
    assert mesh["transport_socket"]["name"] == "envoy.transport_sockets.tls"
    _valid(resources)


def test_an_https_ingress_backend_is_an_rbac_policy_on_every_inbound_route(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    resources = translate(ingress_view("https"), sidecar(), real_material)
    inbound = next(
        x for x in map(as_dict, resources.listeners) if x["name"] == names.INBOUND_LISTENER
    )
    assert len(inbound["filter_chains"]) == 1
    assert "listener_filters" not in inbound
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.INBOUND_ROUTES)
    first = routes["virtual_hosts"][0]["routes"][0]
    assert first["match"] == {"prefix": "/"}  # every request, for the admitted clients
    rbac = first["typed_per_filter_config"]["envoy.filters.http.rbac"]["rbac"]["rules"]
    assert rbac["policies"]["ingress:bookstore/ingress"]["principals"] == [
        {
            "and_ids": {
                "ids": [
                    {"authenticated": {"principal_name": {"exact": "nginx.ingress.cluster.local"}}},
                    {
                        "or_ids": {
                            "ids": [
                                {
                                    "direct_remote_ip": {
                                        "address_prefix": "10.0.0.0",
                                        "prefix_len": 8,
                                    }
                                },
                                {
                                    "direct_remote_ip": {
                                        "address_prefix": "127.0.0.1",
                                        "prefix_len": 32,
                                    }
                                },
                            ]
                        }
                    },
                ]
            }
        }
    ]
    _valid(resources)


def test_skipping_client_certificate_validation_is_a_tls_chain_of_its_own(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    view = ingress_view("https")
    rule = view.inbound[0].ingress
    rule.skip_client_cert_validation = True
    rule.sni_hosts.append("bookstore.example.com")
    resources = translate(view, sidecar(), real_material)
    inbound = next(
        x for x in map(as_dict, resources.listeners) if x["name"] == names.INBOUND_LISTENER
    )
    ingress, mesh = inbound["filter_chains"]
    assert ingress["filter_chain_match"]["transport_protocol"] == "tls"
    assert ingress["filter_chain_match"]["server_names"] == ["bookstore.example.com"]
    context = ingress["transport_socket"]["typed_config"]
    assert context["require_client_certificate"] is False
    assert "validation_context_sds_secret_config" not in context["common_tls_context"]
    assert mesh["transport_socket"]["typed_config"]["require_client_certificate"] is True
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.INBOUND_ROUTES)
    for route in routes["virtual_hosts"][0]["routes"]:  # its chain admits it, not RBAC
        rbac = route["typed_per_filter_config"]["envoy.filters.http.rbac"]
        assert "ingress:bookstore/ingress" not in json.dumps(rbac)
    _valid(resources)
