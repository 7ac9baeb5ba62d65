"""Gateway API rules (GRPCRoute, HTTPRoute) as Envoy routes: structure, and Envoy's verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.control import SIDECAR
from trellis_proxy_cp.testing.static import as_dict, cluster, self_signed_material, static_bootstrap
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.gateway import INVALID_BACKEND
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy

V1, V2 = "shop/hello-v1|9000", "shop/hello-v2|9000"
SHOP = "spiffe://cluster.local/ns/shop/sa"
NAMES = ["hello", "hello.shop", "hello.shop.svc", "hello.shop.svc.cluster.local"]


def gateway_view() -> pb.View:
    edits = pb.HeaderEdits(
        set=[pb.Header(name="X-Set", value="1")],
        add=[pb.Header(name="x-add", value="2")],
        remove=["x-gone"],
    )
    routes = [
        pb.Route(
            name="GRPCRoute shop/hello rule 0 match 0",
            source="GRPCRoute shop/hello rule 0",
            match=pb.HttpMatch(
                path_exact="/helloworld.Greeter/SayHello",
                header_matches=[
                    pb.ValueMatch(name="x-version", value="2"),
                    pb.ValueMatch(name="env", value="prod|stage", regex=True),
                ],
            ),
            clusters=[
                pb.WeightedCluster(cluster=V1, weight=70, request_headers=edits),
                pb.WeightedCluster(cluster="", weight=30),
            ],
            request_headers=edits,
            response_headers=pb.HeaderEdits(set=[pb.Header(name="x-r", value="3")]),
            mirrors=[pb.Mirror(cluster=V2, numerator=1, denominator=3)],
            invalid_status=503,
        ),
        pb.Route(
            name="GRPCRoute shop/hello rule 1 match 0",
            source="GRPCRoute shop/hello rule 1",
            hostnames=["hello.shop"],
            match=pb.HttpMatch(path_prefix="/helloworld.Greeter"),
            clusters=[pb.WeightedCluster(cluster=V2, weight=1)],
            invalid_status=503,
        ),
        pb.Route(
            name="HTTPRoute shop/web rule 0 match 0",
            source="HTTPRoute shop/web rule 0",
            match=pb.HttpMatch(
                path_prefix="/old",
                methods=["GET"],
                query_params=[pb.ValueMatch(name="q", value="1")],
            ),
            redirect=pb.Redirect(
                scheme="https", status_code=301, prefix_path="/", matched_prefix="/old"
            ),
            invalid_status=500,
        ),
        pb.Route(
            name="HTTPRoute shop/web rule 1 match 0",
            source="HTTPRoute shop/web rule 1",
            match=pb.HttpMatch(path_regex="/api/.*"),
            clusters=[pb.WeightedCluster(cluster=V1, weight=1)],
            rewrite=pb.Rewrite(hostname="api.internal", full_path="/v2"),
            timeout=90.0,
            backend_timeout=0.5,
            invalid_status=500,
        ),
        pb.Route(
            name="GRPCRoute shop/hello rule 2 match 0",
            source="GRPCRoute shop/hello rule 2",
            match=pb.HttpMatch(path_prefix="/ext.E"),
            direct_status=500,
        ),
        pb.Route(name="no-route", match=pb.HttpMatch(), direct_status=404),
    ]
    return pb.View(
        identity="shop/client",
        namespace="shop",
        service="client",
        service_account="client",
        spiffe_id="spiffe://cluster.local/ns/shop/sa/client",
        version="1",
        mesh=pb.MeshSettings(trust_domain="cluster.local"),
        outbound=[
            pb.OutboundService(
                namespace="shop",
                name="hello",
                port=9000,
                protocol="grpc",
                hostnames=NAMES + [f"{n}:9000" for n in NAMES],
                routes=routes,
                spiffe_ids=["spiffe://cluster.local/ns/shop/sa/hello-v1"],
            )
        ],
        clusters=[
            cluster(V1, ("10.0.0.1", 9000), protocol="grpc", spiffe=f"{SHOP}/hello-v1"),
            cluster(V2, ("10.0.0.1", 9000), protocol="grpc", spiffe=f"{SHOP}/hello-v2"),
        ],
    )


def _hosts() -> dict[str, dict[str, Any]]:
    resources = translate(gateway_view(), SIDECAR, self_signed_material())
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.OUTBOUND_ROUTES)
    return {h["name"]: h for h in routes["virtual_hosts"]}


def test_a_rule_restricted_to_some_names_gets_their_own_virtual_host() -> None:
    hosts = _hosts()
    assert sorted(hosts) == ["shop/hello|9000", "shop/hello|9000|1"]
    restricted = next(h for h in hosts.values() if "hello.shop" in h["domains"])
    assert sorted(restricted["domains"]) == ["hello.shop", "hello.shop:9000"]
    assert len(restricted["routes"]) == 6
    other = next(h for h in hosts.values() if "hello" in h["domains"])
    assert len(other["domains"]) == 6
    assert [r["name"] for r in other["routes"]] == [
        "GRPCRoute shop/hello rule 0 match 0",
        "HTTPRoute shop/web rule 0 match 0",
        "HTTPRoute shop/web rule 1 match 0",
        "GRPCRoute shop/hello rule 2 match 0",
        "no-route",
    ]


def test_matches_weights_invalid_shares_and_filters() -> None:
    first = _hosts()["shop/hello|9000"]["routes"][0]
    assert first["match"]["path"] == "/helloworld.Greeter/SayHello"
    assert first["match"]["headers"] == [
        {"name": "x-version", "string_match": {"exact": "2"}},
        {"name": "env", "string_match": {"safe_regex": {"regex": "prod|stage"}}},
    ]
    action = first["route"]
    assert [(c["name"], c["weight"]) for c in action["weighted_clusters"]["clusters"]] == [
        (V1, 70),
        (INVALID_BACKEND, 30),
    ]
    # SERVICE_UNAVAILABLE is the enum's zero: gRPC UNAVAILABLE for the invalid share
    assert action.get("cluster_not_found_response_code", "SERVICE_UNAVAILABLE") == (
        "SERVICE_UNAVAILABLE"
    )
    assert action["timeout"] == "0s"  # no deadline unless the route sets one: streams live
    backend = action["weighted_clusters"]["clusters"][0]
    assert [h["header"]["key"] for h in backend["request_headers_to_add"]] == ["x-set", "x-add"]
    assert backend["request_headers_to_remove"] == ["x-gone"]
    # APPEND_IF_EXISTS_OR_ADD is the enum's zero (absent from the dict)
    assert [h.get("append_action", "APPEND") for h in first["request_headers_to_add"]] == [
        "OVERWRITE_IF_EXISTS_OR_ADD",
        "APPEND",
    ]
    assert first["response_headers_to_add"][0]["header"] == {"key": "x-r", "value": "3"}
    [mirror] = action["request_mirror_policies"]
    assert mirror["cluster"] == V2
    assert mirror["runtime_fraction"]["default_value"] == {
        "numerator": 333333,
        "denominator": "MILLION",
    }


def test_redirects_rewrites_timeouts_and_direct_responses() -> None:
    routes = {r["name"]: r for r in _hosts()["shop/hello|9000"]["routes"]}
    redirect = routes["HTTPRoute shop/web rule 0 match 0"]
    assert redirect["match"]["path_separated_prefix"] == "/old"
    assert redirect["match"]["query_parameters"] == [{"name": "q", "string_match": {"exact": "1"}}]
    assert redirect["redirect"]["scheme_redirect"] == "https"
    assert redirect["redirect"].get("response_code", "MOVED_PERMANENTLY") == "MOVED_PERMANENTLY"
    assert redirect["redirect"]["regex_rewrite"]["substitution"] == "/"  # "/old/x" -> "/x"
    rewrite = routes["HTTPRoute shop/web rule 1 match 0"]["route"]
    assert rewrite["host_rewrite_literal"] == "api.internal"
    assert rewrite["regex_rewrite"]["substitution"] == "/v2"
    assert (rewrite["timeout"], rewrite["retry_policy"]["per_try_timeout"]) == ("90s", "0.500s")
    assert rewrite["retry_policy"]["num_retries"] == 0
    assert rewrite["cluster_not_found_response_code"] == "INTERNAL_SERVER_ERROR"
    assert routes["GRPCRoute shop/hello rule 2 match 0"]["direct_response"] == {"status": 500}
    assert routes["no-route"]["direct_response"] == {"status": 404}


def test_envoy_accepts_gateway_routes(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    resources = translate(gateway_view(), sidecar(), real_material)
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_proxyless_client_gets_api_listeners_per_name_and_certificate_provider_tls(
    real_material: SecretMaterial,
) -> None:
    resources = translate(gateway_view(), ProxySettings(proxyless=True), real_material)
    listeners = {item["name"]: item for item in map(as_dict, resources.listeners)}
    assert sorted(listeners) == sorted(NAMES + [f"{n}:9000" for n in NAMES])
    manager = listeners["hello.shop:9000"]["api_listener"]["api_listener"]
    assert manager["rds"]["route_config_name"] == "proxyless|shop/hello|9000"
    [config] = map(as_dict, resources.routes)
    routes = {r["name"]: r for h in config["virtual_hosts"] for r in h["routes"]}
    prefix = routes["GRPCRoute shop/hello rule 1 match 0"]["match"]
    assert prefix == {"safe_regex": {"regex": "/helloworld\\.Greeter(/.*)?"}}  # not gRPC's
    timed = routes["HTTPRoute shop/web rule 1 match 0"]["route"]
    assert timed["max_stream_duration"]["max_stream_duration"] == "90s"
    assert "retry_policy" not in timed
    # no direct responses in gRPC: a fault aborts with the code a sidecar's client sees
    fault = "envoy.filters.http.fault"
    assert [f["name"] for f in manager["http_filters"]] == [fault, "envoy.filters.http.router"]
    for name, code in (("no-route", 12), ("GRPCRoute shop/hello rule 2 match 0", 2)):
        aborted = routes[name]
        assert "direct_response" not in aborted
        assert aborted["route"]["cluster"] == V1
        abort = aborted["typed_per_filter_config"][fault]["abort"]
        assert abort == {"grpc_status": code, "percentage": {"numerator": 100}}
    clusters = {c["name"]: c for c in map(as_dict, resources.clusters)}
    tls = clusters[V1]["transport_socket"]["typed_config"]["common_tls_context"]
    assert tls["tls_certificate_provider_instance"]["instance_name"] == "trellis"
    validation = tls["validation_context"]
    assert validation["ca_certificate_provider_instance"]["instance_name"] == "trellis"
    assert validation["match_subject_alt_names"] == [
        {"exact": "spiffe://cluster.local/ns/shop/sa/hello-v1"}
    ]
    assert "typed_extension_protocol_options" not in clusters[V1]
    assert {e["cluster_name"] for e in map(as_dict, resources.endpoints)} == {V1, V2}
    # no inbound side, and no key: gRPC reads the workload's own files (its provider)
    assert [as_dict(s)["name"] for s in resources.secrets] == [names.MESH_CA]


def test_proxyless_settings_come_from_node_metadata() -> None:
    from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, from_metadata

    assert from_metadata({"trellis": {"proxyless": True}}).key() == "proxyless"
    assert from_metadata({"trellis": {}}).proxyless is False
    with pytest.raises(InvalidNodeMetadata, match="proxyless: 'yes' is not true or false"):
        from_metadata({"trellis": {"proxyless": "yes"}})
