"""Translation from catalog views to Envoy resources, checked by structure and by Envoy.

Envoy itself judges the output: the resources are folded into a static bootstrap (RDS
inlined, EDS made static, SDS secrets made static) and run through ``envoy --mode
validate``, so a field Envoy rejects fails here rather than as a NACK in production.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import json_format

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import (
    BOOKSTORE_SPIFFE,
    BUYER_SPIFFE,
    as_dict,
    buyer_view,
    cluster,
    static_bootstrap,
)
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.proxy import Resources, translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, ProxySettings, from_metadata
from trellis_testing import envoy

MATERIAL = SecretMaterial(b"-----BEGIN CERTIFICATE-----\n", b"key", b"ca")


def store_view(protocol: str = "http", rules: bool = True, permissive: bool = False) -> pb.View:
    rule = pb.InboundRule(
        policy="bookstore/bookbuyer-access",
        source_spiffe_ids=[BUYER_SPIFFE],
        http=[
            pb.HttpMatch(path_regex="/books-bought", methods=["GET"]),
            pb.HttpMatch(path_regex=".*", methods=["*"], headers={"user-agent": ".*Firefox.*"}),
        ],
    )
    return pb.View(
        identity="bookstore/bookstore-v1",
        namespace="bookstore",
        service="bookstore-v1",
        inbound=[
            pb.InboundPort(
                port=14001,
                target_port=8081,
                protocol=protocol,
                name="http",
                rules=[rule] if rules else [],
                allow_any=permissive,
            )
        ],
    )


def test_outbound_routes_hosts_and_weights() -> None:
    resources = translate(buyer_view(), ProxySettings(), MATERIAL)
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.OUTBOUND_ROUTES)
    hosts = {h["name"]: h for h in routes["virtual_hosts"]}
    split = hosts["bookstore/bookstore|14001"]["routes"][0]["route"]["weighted_clusters"]
    assert [(c["name"], c["weight"]) for c in split["clusters"]] == [
        ("bookstore/bookstore-v1|14001", 80),
        ("bookstore/bookstore-v2|14001", 20),
    ]
    # "bookstore:14001" was claimed by the first virtual host: not repeated (Envoy would NACK)
    assert hosts["bookstore/bookstore-v1|14001"]["domains"] == ["bookstore-v1"]
    match = hosts["bookstore/bookstore-v1|14001"]["routes"][0]["match"]
    assert match["safe_regex"]["regex"] == "/books.*"
    assert match["headers"][0] == {
        "name": ":method",
        "string_match": {"safe_regex": {"regex": "GET|POST"}},
    }
    assert match["headers"][1]["name"] == "x-tenant"
    assert hosts["external/api.example.com|80"]["domains"] == [
        "api.example.com",
        "api.example.com:80",
    ]
    assert [item["name"] for item in map(as_dict, resources.listeners)] == [names.OUTBOUND_LISTENER]


def test_clusters_by_discovery_and_tls() -> None:
    found = {
        c["name"]: c
        for c in map(as_dict, translate(buyer_view(), ProxySettings(), MATERIAL).clusters)
    }
    mesh = found["bookstore/bookstore-v1|14001"]
    assert mesh["type"] == "EDS"
    tls = mesh["transport_socket"]["typed_config"]
    assert tls["sni"] == "bookstore-v1.bookstore.svc.cluster.local"
    validation = tls["common_tls_context"]["combined_validation_context"]
    assert validation["default_validation_context"]["match_typed_subject_alt_names"] == [
        {"san_type": "URI", "matcher": {"exact": BOOKSTORE_SPIFFE}}
    ]
    assert (
        tls["common_tls_context"]["tls_certificate_sds_secret_configs"][0]["name"]
        == names.SERVICE_CERT
    )
    assert found["shop/api.example.com|80"]["type"] == "STRICT_DNS"
    assert "transport_socket" not in found["shop/api.example.com|80"]
    assert found["shop/passthrough.example|443"]["type"] == "ORIGINAL_DST"
    assert "typed_extension_protocol_options" in found["grpc/echo|9000"]


def test_endpoints_by_locality_with_weights() -> None:
    resources = translate(buyer_view(), ProxySettings(), MATERIAL)
    loads = {e["cluster_name"]: e for e in map(as_dict, resources.endpoints)}
    assert set(loads) == {
        "bookstore/bookstore-v1|14001",
        "bookstore/bookstore-v2|14001",
        "grpc/echo|9000",
    }
    group = loads["bookstore/bookstore-v1|14001"]["endpoints"][0]
    assert group["locality"] == {"region": "eu", "zone": "west"}
    assert group["load_balancing_weight"] == 2
    assert [
        e["endpoint"]["address"]["socket_address"]["address"] for e in group["lb_endpoints"]
    ] == ["10.0.0.1", "10.0.0.2"]


METHOD_GET = [{"name": ":method", "string_match": {"exact": "GET"}}]
FIREFOX = {"safe_regex": {"regex": ".*Firefox.*"}}


def inbound_routes(resources: Resources) -> list[dict[str, Any]]:
    """The inbound routes before the last, which answers 404 itself (checked here)."""
    routes = {r["name"]: r for r in map(as_dict, resources.routes)}
    (host,) = routes[names.INBOUND_ROUTES]["virtual_hosts"]
    routes_of_host: list[dict[str, Any]] = host["routes"]
    *found, unrouted = routes_of_host
    assert unrouted["direct_response"] == {"status": 404}
    assert unrouted["match"] == {"prefix": "/"}
    per_route = unrouted["typed_per_filter_config"]["envoy.filters.http.rbac"]
    assert set(per_route) == {"@type"}  # no rbac: RBAC is off for the 404 route only
    return found


def inbound_route_rbac(resources: Resources) -> dict[str, Any]:
    """The RBAC rules the inbound routes carry (their ``RBACPerRoute``): the same on each."""
    carried = []
    for route in inbound_routes(resources):
        per_route = route["typed_per_filter_config"]["envoy.filters.http.rbac"]
        assert per_route["@type"].endswith("rbac.v3.RBACPerRoute")
        carried.append(per_route["rbac"]["rules"])
    assert carried, "no inbound route"
    assert all(rules == carried[0] for rules in carried)
    rules: dict[str, Any] = carried[0]
    return rules


def test_inbound_mtls_and_rbac_from_traffic_targets() -> None:
    resources = translate(store_view(), ProxySettings(inbound_port=15103, app_port=8081), MATERIAL)
    listeners = {item["name"]: item for item in map(as_dict, resources.listeners)}
    inbound = listeners[names.INBOUND_LISTENER]
    assert inbound["address"]["socket_address"]["port_value"] == 15103
    chain = inbound["filter_chains"][0]
    assert chain["transport_socket"]["typed_config"]["require_client_certificate"] is True
    manager = chain["filters"][0]["typed_config"]
    assert manager["forward_client_cert_details"] == "SANITIZE_SET"
    assert manager["rds"]["route_config_name"] == names.INBOUND_ROUTES
    # the listener's own RBAC filter denies everything: the rules are on the route
    assert manager["http_filters"][0]["name"] == "envoy.filters.http.rbac"
    assert manager["http_filters"][0]["typed_config"]["rules"] == {}
    (policy,) = inbound_route_rbac(resources)["policies"].values()
    assert policy["principals"] == [{"authenticated": {"principal_name": {"exact": BUYER_SPIFFE}}}]
    first, second = policy["permissions"]
    assert (
        first["and_rules"]["rules"][0]["url_path"]["path"]["safe_regex"]["regex"] == "/books-bought"
    )
    assert second["and_rules"]["rules"][0]["header"]["name"] == "user-agent"
    # one route per allowed match (OSM: no route, 404; a route not allowed, 403)
    assert [r["match"] for r in inbound_routes(resources)] == [
        {"safe_regex": {"regex": "/books-bought"}, "headers": METHOD_GET},
        {"prefix": "/", "headers": [{"name": "user-agent", "string_match": FIREFOX}]},
    ]
    app = {c["name"]: c for c in map(as_dict, resources.clusters)}["inbound|14001"]
    assert app["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"][
        "socket_address"
    ] == {"address": "127.0.0.1", "port_value": 8081}


def test_no_rule_means_no_route_and_permissive_allows_any_request() -> None:
    denied = translate(store_view(rules=False), ProxySettings(), MATERIAL)
    assert inbound_routes(denied) == []  # every request finds no route: 404, as in OSM
    allowed = translate(store_view(rules=False, permissive=True), ProxySettings(), MATERIAL)
    assert [r["match"] for r in inbound_routes(allowed)] == [{"prefix": "/"}]
    assert "permissive" in inbound_route_rbac(allowed)["policies"]


@pytest.mark.parametrize(
    "changed",
    [
        store_view(rules=False),  # TrafficTarget removed
        store_view(rules=False, permissive=True),  # permissive mode on (and off again)
        store_view(permissive=True),
    ],
    ids=["revoked", "permissive", "permissive-and-rules"],
)
def test_a_policy_change_keeps_the_http_listener_byte_identical(changed: pb.View) -> None:
    """Only the route configuration moves, so Envoy neither replaces nor drains the listener."""
    before = translate(store_view(), ProxySettings(), MATERIAL)
    after = translate(changed, ProxySettings(), MATERIAL)
    assert [m.SerializeToString(deterministic=True) for m in before.listeners] == [
        m.SerializeToString(deterministic=True) for m in after.listeners
    ]
    assert inbound_routes(before) != inbound_routes(after)


def test_a_tcp_policy_change_replaces_only_the_filter_chain() -> None:
    """TCP RBAC is judged per connection, so its rules stay in the chain (Envoy updates the
    chain in place and drains the old one's connections)."""
    before = as_dict(translate(store_view(protocol="tcp"), ProxySettings(), MATERIAL).listeners[1])
    revoked = translate(store_view(protocol="tcp", rules=False), ProxySettings(), MATERIAL)
    after = as_dict(revoked.listeners[1])
    assert after["filter_chains"] != before["filter_chains"]
    assert {k: v for k, v in after.items() if k != "filter_chains"} == {
        k: v for k, v in before.items() if k != "filter_chains"
    }
    assert after["filter_chains"][0]["filters"][0]["typed_config"]["rules"] == {}


def test_tcp_inbound_uses_network_rbac_and_tcp_proxy() -> None:
    resources = translate(store_view(protocol="tcp"), ProxySettings(), MATERIAL)
    chain = as_dict(resources.listeners[1])["filter_chains"][0]
    assert [f["name"] for f in chain["filters"]] == [
        "envoy.filters.network.rbac",
        "envoy.filters.network.tcp_proxy",
    ]
    assert [r["name"] for r in map(as_dict, resources.routes)] == [names.OUTBOUND_ROUTES]


def test_secrets_only_when_material_is_there_and_never_a_key() -> None:
    own = ProxySettings(workload_dir="/srv/proxy")
    assert translate(store_view(), own, None).secrets == []
    keyed = SecretMaterial(b"-----BEGIN CERTIFICATE-----\n", b"SERVICE-KEY-BYTES", b"ca")
    found = translate(store_view(), own, keyed).secrets
    assert [as_dict(s)["name"] for s in found] == [names.SERVICE_CERT, names.MESH_CA]
    assert b"SERVICE-KEY-BYTES" not in b"".join(s.SerializeToString() for s in found)
    # a bootstrap naming no folder of its own (made before proxies had their own
    # certificates; proxy-cp refuses its stream): only the trust bundle, no service key
    bare = translate(store_view(), ProxySettings(), MATERIAL).secrets
    assert [as_dict(s)["name"] for s in bare] == [names.MESH_CA]


@pytest.mark.parametrize(
    "view",
    [
        buyer_view(),
        store_view(),
        store_view(protocol="tcp"),
        store_view(rules=False, permissive=True),
        store_view(rules=False),
    ],
    ids=["outbound", "inbound-http", "inbound-tcp", "permissive", "deny-all"],
)
def test_envoy_accepts_the_translation(
    view: pb.View, real_material: SecretMaterial, sidecar: Callable[..., ProxySettings]
) -> None:
    resources = translate(view, sidecar(app_port=8081), real_material)
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ({"trellis": {"outbound_port": "x"}}, "outbound_port"),
        ({"trellis": {"inbound_port": 70000.0}}, "inbound_port"),
        ({"trellis": {"app_address": "nope"}}, "app_address"),
        (
            {
                "trellis": {
                    "outbound_port": 15001,
                    "inbound_port": 15001,
                    "inbound_address": "127.0.0.1",
                }
            },
            "collide",
        ),
        ({"trellis": "ports"}, "mapping"),
    ],
)
def test_bad_node_metadata_is_named(metadata: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidNodeMetadata, match=problem):
        from_metadata(metadata)


def test_node_metadata_numbers_arrive_as_floats() -> None:
    settings = from_metadata({"trellis": {"outbound_port": 16001.0, "app_port": "8080"}})
    assert (settings.outbound_port, settings.app_port) == (16001, 8080)
    assert from_metadata(None) == ProxySettings()


def egress_tcp_view() -> pb.View:
    view = buyer_view()
    view.mesh.egress = True
    db, db2 = "shop/db|5432", "shop/db-replica|5432"
    view.outbound.append(
        pb.OutboundService(
            namespace="shop",
            name="db",
            port=5432,
            protocol="tcp",
            hostnames=["db"],
            routes=[
                pb.Route(
                    name="split",
                    clusters=[
                        pb.WeightedCluster(cluster=db, weight=90),
                        pb.WeightedCluster(cluster=db2, weight=10),
                    ],
                )
            ],
        )
    )
    view.outbound.append(
        pb.OutboundService(
            namespace="shop",
            name="clash",
            port=15001,
            protocol="tcp",
            hostnames=["clash"],
            routes=[pb.Route(name="default", clusters=[pb.WeightedCluster(cluster=db, weight=1)])],
        )
    )
    view.clusters.append(cluster(db, ("10.0.1.1", 5432), protocol="tcp"))
    view.clusters.append(cluster(db2, ("10.0.1.2", 5432), protocol="tcp"))
    return view


def test_egress_goes_through_the_dynamic_forward_proxy_after_mesh_hosts() -> None:
    resources = translate(egress_tcp_view(), ProxySettings(), MATERIAL)
    routes = next(r for r in map(as_dict, resources.routes) if r["name"] == names.OUTBOUND_ROUTES)
    last = routes["virtual_hosts"][-1]
    assert last["domains"] == ["*"]
    assert [r["route"]["cluster"] for r in last["routes"]] == [names.EGRESS, names.EGRESS]
    assert last["routes"][0]["route"]["upgrade_configs"][0]["upgrade_type"] == "CONNECT"
    outbound = next(
        item
        for item in map(as_dict, resources.listeners)
        if item["name"] == names.OUTBOUND_LISTENER
    )
    filters = outbound["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
    assert [f["name"] for f in filters] == [
        "envoy.filters.http.dynamic_forward_proxy",
        "envoy.filters.http.router",
    ]
    egress_cluster = next(c for c in map(as_dict, resources.clusters) if c["name"] == names.EGRESS)
    assert egress_cluster["cluster_type"]["name"] == "envoy.clusters.dynamic_forward_proxy"
    # without egress: no catch-all, no forward proxy
    plain = translate(buyer_view(), ProxySettings(), MATERIAL)
    assert all(
        h["domains"] != ["*"]
        for r in map(as_dict, plain.routes)
        for h in r.get("virtual_hosts", [])
    )


def test_tcp_destinations_get_local_listeners_on_their_port() -> None:
    resources = translate(egress_tcp_view(), ProxySettings(outbound_port=15001), MATERIAL)
    by_name = {item["name"]: item for item in map(as_dict, resources.listeners)}
    db = by_name[names.outbound_tcp_listener("shop", "db", 5432)]
    assert db["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 5432}
    proxy = db["filter_chains"][0]["filters"][0]["typed_config"]
    assert [(c["name"], c["weight"]) for c in proxy["weighted_clusters"]["clusters"]] == [
        ("shop/db|5432", 90),
        ("shop/db-replica|5432", 10),
    ]
    # a destination on the proxy's own outbound port is skipped rather than NACKed
    assert names.outbound_tcp_listener("shop", "clash", 15001) not in by_name


def test_a_tcp_destination_the_catalog_marks_shadowed_gets_no_listener() -> None:
    view = egress_tcp_view()
    [db] = [o for o in view.outbound if o.name == "db"]
    loser = view.outbound.add()
    loser.CopyFrom(db)
    loser.name, loser.shadowed_by = "a-cache", "shop/db"  # first by name, yet it loses
    resources = translate(view, ProxySettings(outbound_port=15001), MATERIAL)
    names_made = [item["name"] for item in map(as_dict, resources.listeners)]
    assert names.outbound_tcp_listener("shop", "db", 5432) in names_made
    assert names.outbound_tcp_listener("shop", "a-cache", 5432) not in names_made


def test_envoy_accepts_egress_and_tcp_listeners(
    real_material: SecretMaterial, sidecar: Callable[..., ProxySettings]
) -> None:
    resources = translate(egress_tcp_view(), sidecar(app_port=8081), real_material)
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_meshconfig_tracing_makes_every_http_manager_report_tagged_zipkin_spans(
    real_material: SecretMaterial,
    sidecar: Callable[..., ProxySettings],
) -> None:
    view = store_view()
    view.mesh.tracing.CopyFrom(
        pb.Tracing(address="zipkin.tracing", port=9411, endpoint="/api/v2/spans")
    )
    resources = translate(view, sidecar(app_port=8081), real_material)
    listeners = {item["name"]: item for item in map(as_dict, resources.listeners)}
    for name, direction in (
        (names.OUTBOUND_LISTENER, "outbound"),
        (names.INBOUND_LISTENER, "inbound"),
    ):
        manager = listeners[name]["filter_chains"][0]["filters"][0]["typed_config"]
        traced = manager["tracing"]
        assert traced["provider"]["name"] == "envoy.tracers.zipkin"
        zipkin = traced["provider"]["typed_config"]
        assert (zipkin["collector_cluster"], zipkin["collector_endpoint"]) == (
            "trellis-tracing",
            "/api/v2/spans",
        )
        assert zipkin["collector_endpoint_version"] == "HTTP_JSON"
        assert {t["tag"]: t["literal"]["value"] for t in traced["custom_tags"]} == {
            "service": "bookstore/bookstore-v1",
            "direction": direction,
        }
    clusters = {c["name"]: c for c in map(as_dict, resources.clusters)}
    address = clusters["trellis-tracing"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert address["endpoint"]["address"]["socket_address"] == {
        "address": "zipkin.tracing",
        "port_value": 9411,
    }
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr
    untraced = translate(store_view(), sidecar(app_port=8081), real_material)
    assert "trellis-tracing" not in {c["name"] for c in map(as_dict, untraced.clusters)}
    assert all("tracing" not in json_format.MessageToJson(item) for item in untraced.listeners)
