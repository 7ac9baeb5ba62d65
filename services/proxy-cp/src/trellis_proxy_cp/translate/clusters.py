"""CDS: one cluster per destination service port, plus the local application's.

- Mesh services (catalog discovery STATIC): EDS over ADS, mTLS presenting the identity's
  certificate and verifying the destination's SPIFFE ids against the mesh CA; a
  MESH_INTERNAL ServiceEntry's ``subjectAltNames`` are accepted names too (Istio's
  ISTIO_MUTUAL: the peer must present one of the SPIFFE ids or of those names).
- ServiceEntry ``resolution: DNS``: STRICT_DNS with the hostnames inline (Envoy resolves,
  and balances over every address of every name). ``DNS_ROUND_ROBIN`` (catalog discovery
  ``LOGICAL_DNS``): LOGICAL_DNS, one name whose first answer each new connection takes, as
  Istio builds it; Envoy takes exactly one endpoint there, so a merged cluster with several
  names (an entry of several hosts and no endpoints) stays STRICT_DNS.
- ServiceEntry ``resolution: NONE``: ORIGINAL_DST (the address the caller dialed); on a VM
  sidecar its TLS hosts also get a dynamic forward proxy cluster (``external``).
- HTTP/2 and gRPC ports speak HTTP/2 upstream.
- Circuit breakers as OSM sets them: thresholds at their maximum (circuit breaking off)
  unless an UpstreamTrafficSetting's ``connectionSettings`` for the service sets them, with
  its connect timeout and requests per connection; its ``outlierDetection`` as Envoy's.
- Locality-weighted load balancing on an EDS cluster with outlier detection: each locality
  (the endpoints' ``region/zone/subzone``) is picked by its weight (the sum of its
  endpoints', endpoints.py) times its healthy share, so as outlier detection ejects a
  locality's hosts its traffic moves to the others (Envoy's overprovisioning factor 1.4: a
  locality keeps its whole share until under about 71% of its hosts are healthy). With every
  host healthy the split is what per-endpoint weights give anyway.
- ``inbound|<port>``: the local application, behind the inbound listener.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import circuit_breaker_pb2, cluster_pb2, outlier_detection_pb2
from envoy.config.core.v3 import protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import capture, egress, endpoints, external, names, tracing
from trellis_proxy_cp.translate.common import (
    ads,
    one_endpoint,
    pack,
    seconds,
    socket_address,
    upstream_tls,
)
from trellis_proxy_cp.translate.routes import HTTP_PROTOCOLS
from trellis_proxy_cp.translate.settings import ProxySettings

CONNECT_TIMEOUT = 1.0
HTTP_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
UNLIMITED = 2**32 - 1  # OSM's default thresholds: circuit breaking off


def _http_options(
    cluster: cluster_pb2.Cluster, http2: bool, max_requests_per_connection: int | None = None
) -> None:
    config = http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig()
    if http2:
        config.http2_protocol_options.CopyFrom(protocol_pb2.Http2ProtocolOptions())
    else:
        config.http_protocol_options.CopyFrom(protocol_pb2.Http1ProtocolOptions())
    options = http_protocol_options_pb2.HttpProtocolOptions(explicit_http_config=config)
    if max_requests_per_connection is not None:
        options.common_http_protocol_options.max_requests_per_connection.value = (
            max_requests_per_connection
        )
    cluster.typed_extension_protocol_options[HTTP_OPTIONS].CopyFrom(pack(options))


def _http2(cluster: cluster_pb2.Cluster) -> None:
    _http_options(cluster, http2=True)


def _connection_settings(
    cluster: cluster_pb2.Cluster,
    settings: catalog_pb2.ConnectionSettings | None,
    protocol: str,
) -> None:
    """OSM's ``applyUpstreamConnectionSettings``: thresholds at their maximum unless set."""
    threshold = circuit_breaker_pb2.CircuitBreakers.Thresholds(track_remaining=True)
    for field in ("max_connections", "max_requests", "max_pending_requests", "max_retries"):
        value = UNLIMITED
        if settings is not None and settings.HasField(field):
            value = getattr(settings, field)
        getattr(threshold, field).value = value
    cluster.circuit_breakers.thresholds.append(threshold)
    if settings is None:
        return
    if settings.HasField("outlier_detection"):
        cluster.outlier_detection.CopyFrom(_outlier_detection(settings.outlier_detection))
        if cluster.type == cluster_pb2.Cluster.EDS:  # localities come with the endpoints
            cluster.common_lb_config.locality_weighted_lb_config.SetInParent()
    if settings.HasField("connect_timeout"):
        cluster.connect_timeout.CopyFrom(seconds(settings.connect_timeout))
    if settings.HasField("max_requests_per_connection") and protocol in HTTP_PROTOCOLS:
        http2 = protocol in ("http2", "grpc")
        _http_options(cluster, http2, settings.max_requests_per_connection)


def _outlier_detection(
    source: catalog_pb2.OutlierDetection,
) -> outlier_detection_pb2.OutlierDetection:
    """Istio's mapping of its outlierDetection fields: a consecutive count that is unset or 0
    is not enforced, and success-rate ejection is off; Envoy's defaults fill the rest
    (interval 10 s, base ejection time 30 s, at most 10% ejected)."""
    found = outlier_detection_pb2.OutlierDetection(
        enforcing_success_rate=wrappers_pb2.UInt32Value(value=0)
    )
    five = source.consecutive_5xx if source.HasField("consecutive_5xx") else 0
    if five:
        found.consecutive_5xx.value = five
    found.enforcing_consecutive_5xx.value = 100 if five else 0
    gateway = (
        source.consecutive_gateway_errors if source.HasField("consecutive_gateway_errors") else 0
    )
    if gateway:
        found.consecutive_gateway_failure.value = gateway
    found.enforcing_consecutive_gateway_failure.value = 100 if gateway else 0
    if source.HasField("interval"):
        found.interval.CopyFrom(seconds(source.interval))
    if source.HasField("base_ejection_time"):
        found.base_ejection_time.CopyFrom(seconds(source.base_ejection_time))
    if source.HasField("max_ejection_percent"):
        found.max_ejection_percent.value = source.max_ejection_percent
    return found


def mesh_cluster(source: catalog_pb2.Cluster) -> cluster_pb2.Cluster:
    cluster = cluster_pb2.Cluster(
        name=source.name,
        connect_timeout=seconds(CONNECT_TIMEOUT),
        lb_policy=cluster_pb2.Cluster.ROUND_ROBIN,
    )
    if source.discovery in endpoints.DNS:
        logical = source.discovery == "LOGICAL_DNS" and len(source.endpoints) == 1
        cluster.type = cluster_pb2.Cluster.STRICT_DNS
        if logical:
            cluster.type = cluster_pb2.Cluster.LOGICAL_DNS
        cluster.dns_lookup_family = cluster_pb2.Cluster.V4_PREFERRED
        cluster.load_assignment.CopyFrom(
            endpoint_pb2.ClusterLoadAssignment(
                cluster_name=source.name,
                endpoints=[
                    endpoint_components_pb2.LocalityLbEndpoints(
                        lb_endpoints=[
                            endpoint_components_pb2.LbEndpoint(
                                endpoint=endpoint_components_pb2.Endpoint(
                                    address=socket_address(e.address, e.port)
                                )
                            )
                            for e in source.endpoints
                        ]
                    )
                ],
            )
        )
    elif source.discovery == "PASSTHROUGH":
        cluster.type = cluster_pb2.Cluster.ORIGINAL_DST
        cluster.lb_policy = cluster_pb2.Cluster.CLUSTER_PROVIDED
    else:  # endpoints.is_eds: the load assignment comes over EDS
        cluster.type = cluster_pb2.Cluster.EDS
        cluster.eds_cluster_config.CopyFrom(
            cluster_pb2.Cluster.EdsClusterConfig(eds_config=ads(), service_name=source.name)
        )
    if source.mesh_tls:
        sni = f"{source.service}.{source.namespace}.svc.cluster.local"
        cluster.transport_socket.CopyFrom(
            upstream_tls(sni, list(source.spiffe_ids), list(source.subject_alt_names))
        )
    if source.protocol in ("http2", "grpc"):
        _http2(cluster)
    _connection_settings(
        cluster, source.connection if source.HasField("connection") else None, source.protocol
    )
    return cluster


def inbound_cluster(port: catalog_pb2.InboundPort, settings: ProxySettings) -> cluster_pb2.Cluster:
    app_port = settings.app_port or port.target_port or port.port
    name = names.inbound_cluster(port.port)
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC,
        connect_timeout=seconds(CONNECT_TIMEOUT),
        load_assignment=one_endpoint(name, settings.app_address, app_port),
    )
    if port.protocol in ("http2", "grpc"):
        _http2(cluster)
    return cluster


def clusters(view: catalog_pb2.View, settings: ProxySettings) -> list[cluster_pb2.Cluster]:
    found = [mesh_cluster(c) for c in view.clusters]
    found += [inbound_cluster(p, settings) for p in inbound_ports(view, settings)]
    if view.mesh.egress:
        found.append(egress.cluster())
    if settings.capture:
        found += capture.clusters(view)
    else:  # a VM's resolution NONE TLS hosts: to the host the SNI names
        found += external.clusters(view)
    for route in view.egress:
        cluster = egress.route_cluster(route)
        connection = route.connection if route.HasField("connection") else None
        _connection_settings(cluster, connection, route.protocol)
        found.append(cluster)
    collector = tracing.cluster(view)
    if collector is not None:
        found.append(collector)
    return found


def inbound_ports(view: catalog_pb2.View, settings: ProxySettings) -> list[catalog_pb2.InboundPort]:
    """The ports the inbound listener serves: with one inbound port per proxy (VMs without
    traffic redirection), that is the service's first port; a pod that redirects its
    traffic serves every port (the original destination port tells them apart)."""
    return list(view.inbound) if settings.capture else list(view.inbound[:1])
