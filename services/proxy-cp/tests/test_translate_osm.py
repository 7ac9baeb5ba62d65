"""OSM's policy API on the client's side, as Envoy resources: Retry on the routes, and an
UpstreamTrafficSetting's connection settings and outlier detection on the clusters."""

from __future__ import annotations

from collections.abc import Callable

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import as_dict, buyer_view, static_bootstrap
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy


def test_an_osm_retry_policy_is_on_every_route_of_its_service(
    real_material: SecretMaterial,
    sidecar: Callable[..., ProxySettings],
) -> None:
    view = buyer_view()
    [root] = [o for o in view.outbound if o.name == "bookstore"]
    root.retry.CopyFrom(
        pb.RetryPolicy(
            policy="bookbuyer/retry",
            retry_on="5xx,reset",
            num_retries=0,
            per_try_timeout=1.5,
            backoff_base_interval=0.01,
        )
    )
    resources = translate(view, sidecar(), real_material)
    (routes,) = (r for r in map(as_dict, resources.routes) if r["name"] == names.OUTBOUND_ROUTES)
    hosts = {h["name"]: h for h in routes["virtual_hosts"]}
    retried = [r["route"]["retry_policy"] for r in hosts["bookstore/bookstore|14001"]["routes"]]
    assert retried == [
        {
            "retry_on": "5xx,reset",
            "num_retries": 0,  # set, so no retry at all: not Envoy's default of one
            "per_try_timeout": "1.500s",
            "retry_back_off": {"base_interval": "0.010s"},
        }
    ] * len(retried)
    other = hosts["bookstore/bookstore-v1|14001"]["routes"][0]["route"]
    assert "retry_policy" not in other
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_circuit_breakers_are_off_unless_an_upstream_setting_sets_them(
    real_material: SecretMaterial,
    sidecar: Callable[..., ProxySettings],
) -> None:
    view = buyer_view()
    [limited] = [c for c in view.clusters if c.name == "bookstore/bookstore-v1|14001"]
    limited.connection.CopyFrom(
        pb.ConnectionSettings(
            policy="bookstore/v1",
            max_connections=5,
            connect_timeout=0.25,
            max_pending_requests=2,
            max_requests_per_connection=3,
        )
    )
    resources = translate(view, sidecar(), real_material)
    clusters = {c["name"]: c for c in map(as_dict, resources.clusters)}
    unlimited = 2**32 - 1
    [plain] = clusters["bookstore/bookstore-v2|14001"]["circuit_breakers"]["thresholds"]
    assert plain == {
        "max_connections": unlimited,
        "max_pending_requests": unlimited,
        "max_requests": unlimited,
        "max_retries": unlimited,
        "track_remaining": True,
    }
    v1 = clusters["bookstore/bookstore-v1|14001"]
    [threshold] = v1["circuit_breakers"]["thresholds"]
    assert (threshold["max_connections"], threshold["max_pending_requests"]) == (5, 2)
    assert (threshold["max_requests"], threshold["max_retries"]) == (unlimited, unlimited)
    assert v1["connect_timeout"] == "0.250s"
    options = v1["typed_extension_protocol_options"][
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
    ]
    assert options["common_http_protocol_options"] == {"max_requests_per_connection": 3}
    assert "http_protocol_options" in options["explicit_http_config"]
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_outlier_detection_is_envoys_with_istios_mapping(
    real_material: SecretMaterial, sidecar: Callable[..., ProxySettings]
) -> None:
    view = buyer_view()
    [v1] = [c for c in view.clusters if c.name == "bookstore/bookstore-v1|14001"]
    v1.connection.CopyFrom(
        pb.ConnectionSettings(
            policy="bookstore/v1",
            outlier_detection=pb.OutlierDetection(
                consecutive_5xx=3, interval=5.0, base_ejection_time=60.0, max_ejection_percent=50
            ),
        )
    )
    resources = translate(view, sidecar(), real_material)
    clusters = {c["name"]: c for c in map(as_dict, resources.clusters)}
    assert clusters["bookstore/bookstore-v1|14001"]["outlier_detection"] == {
        "consecutive_5xx": 3,
        "enforcing_consecutive_5xx": 100,
        "enforcing_consecutive_gateway_failure": 0,  # unset: not enforced (Istio's mapping)
        "enforcing_success_rate": 0,
        "interval": "5s",
        "base_ejection_time": "60s",
        "max_ejection_percent": 50,
    }
    assert "outlier_detection" not in clusters["bookstore/bookstore-v2|14001"]
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr
