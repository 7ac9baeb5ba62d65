"""LDS: the outbound listener the application sends mesh traffic to, and the inbound
listener peers reach it through.

Inbound terminates mTLS (a client certificate from the mesh CA is required) and enforces
the TrafficTargets with Envoy RBAC (``authz``). An HTTP inbound listener holds no policy:
its RBAC filter denies everything unless the route (over RDS) says otherwise, so a policy
change never replaces it. A TCP inbound listener holds its rules in the filter chain.
The application sees the caller's identity in ``x-forwarded-client-cert``.
"""

from __future__ import annotations

from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.filters.network.rbac.v3 import rbac_pb2 as network_rbac_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import authz, egress, ingress, names, ratelimit, tracing
from trellis_proxy_cp.translate.common import ads, downstream_mtls, normalized, pack, socket_address
from trellis_proxy_cp.translate.routes import HTTP_PROTOCOLS

ROUTER = hcm.HttpFilter(name="envoy.filters.http.router", typed_config=pack(router_pb2.Router()))


def build_manager(
    view: catalog_pb2.View, stat_prefix: str, route_config: str, filters: list[hcm.HttpFilter]
) -> hcm.HttpConnectionManager:
    manager = normalized(
        hcm.HttpConnectionManager(
            stat_prefix=stat_prefix,
            codec_type=hcm.HttpConnectionManager.AUTO,
            rds=hcm.Rds(config_source=ads(), route_config_name=route_config),
            http_filters=[*filters, ROUTER],
        )
    )
    traced = tracing.tracing(view, stat_prefix)
    if traced is not None:
        manager.tracing.CopyFrom(traced)
    return manager


def outbound(view: catalog_pb2.View, address: str, port: int) -> listener_pb2.Listener:
    filters = [egress.http_filter()] if egress.forward_proxy(view) else []
    manager = build_manager(view, "outbound", names.OUTBOUND_ROUTES, filters)
    return listener_pb2.Listener(
        name=names.OUTBOUND_LISTENER,
        address=socket_address(address, port),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager",
                        typed_config=pack(manager),
                    )
                ]
            )
        ],
    )


def inbound_filters(
    view: catalog_pb2.View, served: catalog_pb2.InboundPort, route_config: str
) -> list[listener_components_pb2.Filter]:
    """The filters behind an inbound port's mTLS: an HTTP connection manager whose routes
    (``route_config``, over RDS) carry the rules, or network RBAC and ``tcp_proxy``."""
    if served.protocol in HTTP_PROTOCOLS:
        # the rules are in the route configuration (authz.per_route): no policy in here
        manager = build_manager(
            view, "inbound", route_config, [authz.http_filter(), ratelimit.http_filter()]
        )
        manager.forward_client_cert_details = hcm.HttpConnectionManager.SANITIZE_SET
        manager.set_current_client_cert_details.uri = True
        return [
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager", typed_config=pack(manager)
            )
        ]
    filters = [
        listener_components_pb2.Filter(
            name="envoy.filters.network.rbac",
            typed_config=pack(
                network_rbac_pb2.RBAC(
                    rules=authz.rules(served, http=False), stat_prefix="inbound_tcp"
                )
            ),
        ),
        listener_components_pb2.Filter(
            name="envoy.filters.network.tcp_proxy",
            typed_config=pack(
                tcp_proxy_pb2.TcpProxy(
                    stat_prefix="inbound_tcp", cluster=names.inbound_cluster(served.port)
                )
            ),
        ),
    ]
    if served.HasField("rate_limit"):  # OSM: connections per unit, before the proxy
        filters.insert(1, ratelimit.tcp_filter(served.rate_limit))
    return filters


def inbound(
    view: catalog_pb2.View, ports: list[catalog_pb2.InboundPort], address: str, port: int
) -> listener_pb2.Listener | None:
    if not ports:
        return None
    served = ports[0]
    filters = inbound_filters(view, served, names.INBOUND_ROUTES)
    listener = listener_pb2.Listener(
        name=names.INBOUND_LISTENER,
        address=socket_address(address, port),
        filter_chains=[
            listener_components_pb2.FilterChain(filters=filters, transport_socket=downstream_mtls())
        ],
    )
    if ingress.chained(served):  # plaintext (or unverified TLS) from an IngressBackend
        listener.listener_filters.append(ingress.tls_inspector())
        listener.filter_chains.insert(0, ingress.filter_chain(served, ROUTER))
    return listener


def tcp_proxy(service: catalog_pb2.OutboundService) -> tcp_proxy_pb2.TcpProxy:
    """``tcp_proxy`` to a TCP destination's cluster, or its weighted clusters (a split)."""
    clusters = [c for c in service.routes[0].clusters if c.weight > 0]
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=f"outbound_tcp_{service.name}")
    if len(clusters) == 1:
        proxy.cluster = clusters[0].cluster
    else:
        proxy.weighted_clusters.CopyFrom(
            tcp_proxy_pb2.TcpProxy.WeightedCluster(
                clusters=[
                    tcp_proxy_pb2.TcpProxy.WeightedCluster.ClusterWeight(
                        name=c.cluster, weight=c.weight
                    )
                    for c in clusters
                ]
            )
        )
    return proxy


def outbound_tcp(
    view: catalog_pb2.View, address: str, taken: set[int]
) -> list[listener_pb2.Listener]:
    """One local listener per TCP destination, on the destination's port.

    Without traffic redirection (a VM) a TCP client has no Host header to route on, so it
    connects to ``<outbound address>:<service port>``, as with Consul's and Linkerd's local
    upstreams. A destination the catalog marks ``shadowed_by`` another (two TCP services on
    one port: the split root wins, then the first by name) gets none; a port the proxy
    itself uses is skipped.
    """
    found = []
    for service in view.outbound:
        if service.protocol in HTTP_PROTOCOLS or service.port in taken or not service.routes:
            continue
        if service.shadowed_by:
            continue
        taken.add(service.port)
        proxy = tcp_proxy(service)
        found.append(
            listener_pb2.Listener(
                name=names.outbound_tcp_listener(service.namespace, service.name, service.port),
                address=socket_address(address, service.port),
                filter_chains=[
                    listener_components_pb2.FilterChain(
                        filters=[
                            listener_components_pb2.Filter(
                                name="envoy.filters.network.tcp_proxy", typed_config=pack(proxy)
                            )
                        ]
                    )
                ],
            )
        )
    return found
