"""OSM's UpstreamTrafficSetting in the catalog: which service its host names (OSM's code:
``<service>.<namespace>.svc.<domain>`` in its own namespace), conflicts, what is not applied
yet, and the connection settings every client's cluster of the service gets."""

from __future__ import annotations

from collections.abc import Callable

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.model.views import (
    ConnectionSettings,
    Identity,
    LocalRateLimit,
    OutlierDetection,
)
from trellis_common.documents.base import Document, DocumentError

Mesh = Callable[..., PolicyBuilder]

SHOP = """apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}}
"""


def setting(name: str = "api", host: str = "api.shop.svc.cluster.local", extra: str = "") -> str:
    return f"""---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {{name: {name}, namespace: shop}}
spec:
  host: {host}
  connectionSettings:
    tcp: {{maxConnections: 5, connectTimeout: 250ms}}
    http: {{maxRequests: 7, maxPendingRequests: 2, maxRequestsPerConnection: 3, maxRetries: 1}}
{extra}"""


def test_every_client_cluster_of_the_service_gets_its_connection_settings(mesh: Mesh) -> None:
    builder = mesh(SHOP + setting())
    clusters = {c.name: c for c in builder.build(Identity("shop", "web"), "web").clusters}
    assert clusters["shop/api|80"].connection == ConnectionSettings(
        policy="shop/api",
        max_connections=5,
        connect_timeout=0.25,
        max_requests=7,
        max_requests_per_connection=3,
        max_pending_requests=2,
        max_retries=1,
    )
    assert clusters["shop/web|80"].connection is None
    assert builder.spec.statuses["UpstreamTrafficSetting shop/api"].state == "valid"


def test_a_host_of_another_namespace_or_a_bare_name_matches_nothing_as_in_osm(mesh: Mesh) -> None:
    for host in ("api", "api.other.svc.cluster.local", "api.shop"):
        builder = mesh(SHOP + setting(host=host))
        status = builder.spec.statuses["UpstreamTrafficSetting shop/api"]
        assert status.state == "error", host
        assert "names no service of namespace 'shop'" in status.reason
        clusters = builder.build(Identity("shop", "web"), "web").clusters
        assert all(c.connection is None for c in clusters)


def test_a_second_setting_for_one_service_is_refused_and_a_global_limit_is_not_applied(
    mesh: Mesh,
) -> None:
    limits = "  rateLimit: {local: {http: {requests: 10, unit: second}}, global: {domain: x}}\n"
    builder = mesh(SHOP + setting("a-first", extra=limits) + setting("b-second"))
    first = builder.spec.statuses["UpstreamTrafficSetting shop/a-first"]
    assert first.state == "warning"
    assert first.reason.startswith("spec.rateLimit.global read but not applied")
    second = builder.spec.statuses["UpstreamTrafficSetting shop/b-second"]
    assert second.state == "error"
    assert "conflicts with UpstreamTrafficSetting shop/a-first" in second.reason
    clusters = {c.name: c for c in builder.build(Identity("shop", "web"), "web").clusters}
    connection = clusters["shop/api|80"].connection
    assert connection is not None
    assert connection.policy == "shop/a-first"


def test_local_rate_limits_go_to_the_destinations_inbound_ports(mesh: Mesh) -> None:
    limits = (
        "  rateLimit:\n"
        "    local:\n"
        "      http: {requests: 10, unit: minute, burst: 5, responseStatusCode: 503,\n"
        "             responseHeadersToAdd: [{name: x-limited, value: 'yes'}]}\n"
        "      tcp: {connections: 3, unit: second}\n"
        "  httpRoutes:\n"
        "  - {path: /books.*, rateLimit: {local: {requests: 2, unit: hour}}}\n"
    )
    builder = mesh(SHOP + setting("limits", extra=limits))
    status = builder.spec.statuses["UpstreamTrafficSetting shop/limits"]
    assert status.state == "valid", status.reason
    [port] = builder.build(Identity("shop", "api"), "api").inbound
    assert port.rate_limit == LocalRateLimit(
        policy="shop/limits",
        tokens_per_fill=10,
        max_tokens=15,
        fill_interval=60.0,
        status=503,
        response_headers=(("x-limited", "yes"),),
    )
    assert port.route_limits == (("/books.*", LocalRateLimit("shop/limits", 2, 2, 3600.0)),)
    # the clients are not limited: only the destination's own sidecars enforce it
    [client_port] = builder.build(Identity("shop", "web"), "web").inbound
    assert client_port.rate_limit is None


def test_outlier_detection_rides_with_the_connection_settings(mesh: Mesh) -> None:
    extra = (
        "  outlierDetection: {consecutive5xxErrors: 2, interval: 5s, baseEjectionTime: 1m,"
        " maxEjectionPercent: 100}\n"
    )
    builder = mesh(SHOP + setting(extra=extra))
    clusters = {c.name: c for c in builder.build(Identity("shop", "web"), "web").clusters}
    connection = clusters["shop/api|80"].connection
    assert connection is not None
    assert connection.outlier == OutlierDetection(
        consecutive_5xx=2, interval=5.0, base_ejection_time=60.0, max_ejection_percent=100
    )


def test_outlier_detection_names_the_field_in_every_error(
    docs_and_errors: Callable[[str], tuple[list[Document], list[DocumentError]]],
) -> None:
    for detection, field, reason in (
        ("{interval: 5s}", "spec.outlierDetection.consecutive5xxErrors", "nothing would eject"),
        ("{consecutive5xxErrors: 1, interval: 0s}", "spec.outlierDetection.interval", "positive"),
        (
            "{consecutive5xxErrors: 1, maxEjectionPercent: 101}",
            "spec.outlierDetection.maxEjectionPercent",
            "less than or equal to 100",
        ),
    ):
        _, errors = docs_and_errors(setting(extra=f"  outlierDetection: {detection}\n"))
        assert [e.field for e in errors] == [field], detection
        assert reason in errors[0].reason, detection
