"""OSM's local rate limits on the destination's inbound side: structure, and Envoy's verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import as_dict, self_signed_material, static_bootstrap
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.ratelimit import HTTP_FILTER, TCP_FILTER
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy

TYPE = "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit"


def limit(tokens: int, burst: int = 0, seconds: float = 60.0, **fields: Any) -> pb.LocalRateLimit:
    return pb.LocalRateLimit(
        policy="bookstore/limits",
        tokens_per_fill=tokens,
        max_tokens=tokens + burst,
        fill_interval=seconds,
        **fields,
    )


def view(protocol: str, port_limit: pb.LocalRateLimit | None) -> pb.View:
    port = pb.InboundPort(
        port=14001,
        target_port=8081,
        protocol=protocol,
        name="http",
        rules=[
            pb.InboundRule(
                policy="bookstore/access",
                source_spiffe_ids=["spiffe://cluster.local/ns/bookbuyer/sa/bookbuyer"],
                http=[pb.HttpMatch(path_regex="/books.*"), pb.HttpMatch(path_regex="/other")],
            )
        ],
        route_limits=[pb.RouteRateLimit(path="/books.*", limit=limit(2, seconds=3600))],
    )
    if port_limit is not None:
        port.rate_limit.CopyFrom(port_limit)
    return pb.View(
        identity="bookstore/bookstore-v1",
        namespace="bookstore",
        service="bookstore-v1",
        inbound=[port],
    )


def test_http_limits_ride_on_the_inbound_virtual_host_and_routes(
    sidecar: Callable[..., ProxySettings], real_material: SecretMaterial
) -> None:
    headers = [pb.Header(name="X-Limited", value="yes")]
    resources = translate(
        view("http", limit(10, burst=5, status=503, response_headers=headers)),
        sidecar(),
        real_material,
    )
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.INBOUND_ROUTES)
    [host] = routes["virtual_hosts"]
    vhost = host["typed_per_filter_config"][HTTP_FILTER]
    assert vhost["@type"] == TYPE
    assert vhost["token_bucket"] == {
        "max_tokens": 15,
        "tokens_per_fill": 10,
        "fill_interval": "60s",
    }
    assert vhost["status"] == {"code": "ServiceUnavailable"}
    assert vhost["response_headers_to_add"][0]["header"] == {"key": "x-limited", "value": "yes"}
    assert vhost["filter_enabled"]["default_value"] == {"numerator": 100}
    books, other, unrouted = host["routes"]
    assert books["typed_per_filter_config"][HTTP_FILTER]["token_bucket"]["max_tokens"] == 2
    assert HTTP_FILTER not in other["typed_per_filter_config"]  # the virtual host's applies
    assert unrouted["direct_response"] == {"status": 404}
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_inbound_http_listener_does_not_change_with_a_limit() -> None:
    material = self_signed_material()
    plain = translate(view("http", None), ProxySettings(), material).listeners
    limited = translate(view("http", limit(10)), ProxySettings(), material).listeners
    assert [m.SerializeToString(deterministic=True) for m in plain] == [
        m.SerializeToString(deterministic=True) for m in limited
    ]


@pytest.mark.parametrize("port_limit", [None, limit(3, burst=1, seconds=1)])
def test_tcp_limits_count_connections_before_the_proxy(
    port_limit: pb.LocalRateLimit | None,
    sidecar: Callable[..., ProxySettings],
    real_material: SecretMaterial,
) -> None:
    resources = translate(view("tcp", port_limit), sidecar(), real_material)
    (inbound,) = (
        x for x in map(as_dict, resources.listeners) if x["name"] == names.INBOUND_LISTENER
    )
    filters = inbound["filter_chains"][0]["filters"]
    if port_limit is None:
        assert TCP_FILTER not in [f["name"] for f in filters]
        return
    assert [f["name"] for f in filters] == [
        "envoy.filters.network.rbac",
        TCP_FILTER,
        "envoy.filters.network.tcp_proxy",
    ]
    assert filters[1]["typed_config"]["token_bucket"] == {
        "max_tokens": 4,
        "tokens_per_fill": 3,
        "fill_interval": "1s",
    }
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr
