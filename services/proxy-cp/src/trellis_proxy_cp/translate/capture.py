"""Listeners for a sidecar whose pod redirects its traffic to it (Kubernetes, ``capture``).

An injected pod's init container sends every outbound TCP connection to Envoy's outbound
port and every inbound one to its inbound port (``trellis_injector.domain.iptables``). The
application dials what it always dialed (a Service's ClusterIP and port, an address on the
internet), so the sidecar chooses by the original destination, not by a port it owns:

- **outbound** (15001): the original destination restored (the ``original_dst`` listener
  filter), and one filter chain per destination, matched by destination address and port
  (Envoy matches the port first, then the address):
  - a mesh service's ClusterIPs (without any, its endpoints' addresses) on each of its
    ports: an HTTP connection manager on the shared outbound routes for ``http``, ``http2``
    and ``grpc`` ports, ``tcp_proxy`` to its (weighted) clusters for ``tcp`` and opaque
    ports. A port whose protocol is declared is never inspected, so a server-first
    protocol (MySQL, SMTP) is not held waiting for a client's first bytes;
  - a ServiceEntry with ``addresses`` (a CIDR; ``resolution: NONE`` keeps the original
    destination): by those addresses and the port;
  - a ServiceEntry host on a TLS or HTTPS port (wildcards too), and an OSM Egress
    ``https`` host: by SNI on the port (``tls_inspector`` runs on those ports only);
  - a ServiceEntry's TCP or MONGO port without ``addresses``: the port, for any address
    (``external``: ``tcp_proxy``, behind ``mongo_proxy`` for MONGO);
  - an HTTP ServiceEntry host or Egress ``http`` rule: the port, for any address, to the
    outbound routes (the Host header decides there);
  - anything else: passed through to where it was going when MeshConfig's
    ``enableEgress`` is on (``trellis-passthrough``, an ORIGINAL_DST cluster), refused
    and counted when it is off (``trellis-blackhole``, a cluster with no endpoint:
    ``tcp.outbound_blackhole.downstream_cx_total`` in the sidecar's statistics).
- **inbound** (15003): the original destination port picks the service port (its target
  port on the pod): mTLS with the port's rules (HTTP ports on their own route
  configuration ``inbound-http|<port>``, TCP ports with network RBAC); in permissive mode
  also plaintext from callers outside the mesh, as OSM's permissive mode admits them; an
  IngressBackend's chain as on a VM. A port no service declares matches no chain: closed.

VM sidecars (no redirection) keep the explicit listeners of ``listeners``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2 as lc
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.listener.original_dst.v3 import original_dst_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.type.v3 import range_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import egress, external, ingress, listeners, names, routes
from trellis_proxy_cp.translate.common import downstream_mtls, pack, seconds, socket_address
from trellis_proxy_cp.translate.routes import HTTP_PROTOCOLS
from trellis_proxy_cp.translate.settings import ProxySettings

PASSTHROUGH = "trellis-passthrough"
BLACKHOLE = "trellis-blackhole"
HCM = "envoy.filters.network.http_connection_manager"
TCP_PROXY = "envoy.filters.network.tcp_proxy"


def _cidr(text: str) -> address_pb2.CidrRange:
    network = ipaddress.ip_network(text, strict=False)
    return address_pb2.CidrRange(
        address_prefix=str(network.network_address),
        prefix_len=wrappers_pb2.UInt32Value(value=network.prefixlen),
    )


def _tcp(stat_prefix: str, cluster: str) -> lc.Filter:
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=stat_prefix, cluster=cluster)
    return lc.Filter(name=TCP_PROXY, typed_config=pack(proxy))


def _http(view: catalog_pb2.View) -> lc.Filter:
    filters = [egress.http_filter()] if egress.forward_proxy(view) else []
    manager = listeners.build_manager(view, "outbound", names.OUTBOUND_ROUTES, filters)
    return lc.Filter(name=HCM, typed_config=pack(manager))


class _Chains:
    """Filter chains by match; the first chain for a match wins (Envoy refuses two chains
    with one match), so the order of ``add`` calls is the order of precedence."""

    def __init__(self) -> None:
        self.chains: list[lc.FilterChain] = []
        self._seen: set[bytes] = set()
        self.sni_ports: set[int] = set()

    def add(self, name: str, match: lc.FilterChainMatch, filters: list[lc.Filter]) -> None:
        key = match.SerializeToString(deterministic=True)
        if key in self._seen:
            return
        self._seen.add(key)
        if match.server_names:
            self.sni_ports.add(match.destination_port.value)
        self.chains.append(lc.FilterChain(name=name, filter_chain_match=match, filters=filters))

    def by_addresses(
        self, name: str, addresses: Iterable[str], port: int, filters: list[lc.Filter]
    ) -> None:
        # one chain per address: a pod behind two headless Services on one port is reached
        # through the first only, instead of the whole chain being refused
        for address in addresses:
            match = lc.FilterChainMatch(
                destination_port=wrappers_pb2.UInt32Value(value=port),
                prefix_ranges=[_cidr(address)],
            )
            self.add(name, match, filters)


def _port_predicate(ports: set[int]) -> lc.ListenerFilterChainMatchPredicate:
    rules = [
        lc.ListenerFilterChainMatchPredicate(
            destination_port_range=range_pb2.Int32Range(start=port, end=port + 1)
        )
        for port in sorted(ports)
    ]
    if len(rules) == 1:
        return rules[0]
    return lc.ListenerFilterChainMatchPredicate(
        or_match=lc.ListenerFilterChainMatchPredicate.MatchSet(rules=rules)
    )


def _weighted(service: catalog_pb2.OutboundService) -> lc.Filter:
    return lc.Filter(name=TCP_PROXY, typed_config=pack(listeners.tcp_proxy(service)))


def _addresses(
    service: catalog_pb2.OutboundService, by_name: dict[str, catalog_pb2.Cluster]
) -> list[str]:
    """Where the application dials the service: its ClusterIPs, or without any (a headless
    Service, registered workloads) its endpoints' own addresses, which DNS gives it."""
    if service.addresses:
        return list(service.addresses)
    found = set()
    for route in service.routes:
        for weighted in route.clusters:
            cluster = by_name.get(weighted.cluster)
            for endpoint in cluster.endpoints if cluster is not None else ():
                try:
                    found.add(str(ipaddress.ip_address(endpoint.address)))
                except ValueError:
                    continue  # a hostname: nothing to match a destination address on
    return sorted(found)


def endpoint_addressed(view: catalog_pb2.View) -> set[str]:
    """The clusters whose endpoints' addresses the outbound listener matches on (those of
    the services without addresses of their own: :func:`_addresses`)."""
    return {
        weighted.cluster
        for service in view.outbound
        if service.routes and not service.addresses
        for route in service.routes
        for weighted in route.clusters
    }


def outbound(view: catalog_pb2.View, settings: ProxySettings) -> listener_pb2.Listener:
    chains = _Chains()
    http = [_http(view)]
    by_name = {c.name: c for c in view.clusters}
    for service in view.outbound:
        if not service.routes:
            continue
        name = f"outbound|{service.namespace}/{service.name}|{service.port}"
        filters = http if service.protocol in HTTP_PROTOCOLS else [_weighted(service)]
        chains.by_addresses(name, _addresses(service, by_name), service.port, filters)
    for entry in view.external:
        name = f"external|{entry.host}|{entry.port}"
        is_http = entry.protocol in HTTP_PROTOCOLS
        filters = http if is_http else external.filters(entry)
        port_only = lc.FilterChainMatch(destination_port=wrappers_pb2.UInt32Value(value=entry.port))
        if entry.addresses:
            chains.by_addresses(name, entry.addresses, entry.port, filters)
        elif is_http:
            chains.add(f"outbound-http|{entry.port}", port_only, http)
        elif external.by_sni(entry):
            chains.add(name, external.sni_match(entry.host, entry.port), filters)
        else:  # TCP and MONGO without addresses: the port, for any address (Istio's)
            chains.add(name, port_only, filters)
    for route in view.egress:
        _egress_chain(chains, route, http)
    listener = listener_pb2.Listener(
        name=names.OUTBOUND_LISTENER,
        address=socket_address(settings.outbound_address, settings.outbound_port),
        listener_filters=[_original_destination()],
        filter_chains=chains.chains,
        default_filter_chain=_fallback(view),
    )
    if chains.sni_ports:  # read a ClientHello only where an SNI chain needs it
        inspector = ingress.tls_inspector()
        inspector.filter_disabled.CopyFrom(
            lc.ListenerFilterChainMatchPredicate(not_match=_port_predicate(chains.sni_ports))
        )
        listener.listener_filters.append(inspector)
    return listener


def _original_destination() -> lc.ListenerFilter:
    """The destination the connection had before the redirection (``SO_ORIGINAL_DST``),
    restored as its local address, first: the filter chains, and the predicate that keeps
    the TLS inspector off other ports, match on it.

    This is what ``use_original_dst`` does, without that flag's hand-off to another
    listener bound to the original address: a connection to some host's port 15003 or
    15010 must not land on this sidecar's own inbound or statistics listener (and with the
    flag, Envoy runs its implicit filter after the configured ones, so the inspector's
    predicate would see port 15001)."""
    return lc.ListenerFilter(
        name="envoy.filters.listener.original_dst",
        typed_config=pack(original_dst_pb2.OriginalDst()),
    )


def _egress_chain(chains: _Chains, route: catalog_pb2.EgressRoute, http: list[lc.Filter]) -> None:
    """An OSM Egress rule (MeshConfig egress off): what it allows passes through."""
    name = f"egress|{','.join(route.policies)}|{route.protocol}|{route.port}"
    port = wrappers_pb2.UInt32Value(value=route.port)
    passthrough = [_tcp("outbound_egress", PASSTHROUGH)]
    if route.protocol == "http":
        chains.add(f"outbound-http|{route.port}", lc.FilterChainMatch(destination_port=port), http)
    elif route.protocol == "https" and route.host and not route.host.startswith("*"):
        chains.add(name, external.sni_match(route.host, route.port), passthrough)
    elif route.ip_ranges:
        chains.by_addresses(name, route.ip_ranges, route.port, passthrough)
    else:  # any address on the port
        chains.add(name, lc.FilterChainMatch(destination_port=port), passthrough)


def _fallback(view: catalog_pb2.View) -> lc.FilterChain:
    if view.mesh.egress:
        return lc.FilterChain(
            name="passthrough", filters=[_tcp("outbound_passthrough", PASSTHROUGH)]
        )
    return lc.FilterChain(name="blackhole", filters=[_tcp("outbound_blackhole", BLACKHOLE)])


def clusters(view: catalog_pb2.View) -> list[cluster_pb2.Cluster]:
    """The passthrough cluster (egress on, and what Egress policies allow), and the
    blackhole cluster when egress is off."""
    found = [
        cluster_pb2.Cluster(
            name=PASSTHROUGH,
            type=cluster_pb2.Cluster.ORIGINAL_DST,
            lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
            connect_timeout=seconds(5.0),
        )
    ]
    if not view.mesh.egress:
        found.append(
            cluster_pb2.Cluster(
                name=BLACKHOLE, type=cluster_pb2.Cluster.STATIC, connect_timeout=seconds(1.0)
            )
        )
    return found


def inbound_route_name(port: catalog_pb2.InboundPort) -> str:
    return f"{names.INBOUND_ROUTES}|{port.port}"


def _served(view: catalog_pb2.View) -> list[tuple[int, catalog_pb2.InboundPort]]:
    """Each inbound port with the pod port a caller dials (its target port); the first
    service port for a pod port wins."""
    found: dict[int, catalog_pb2.InboundPort] = {}
    for port in view.inbound:
        found.setdefault(port.target_port or port.port, port)
    return sorted(found.items())


def inbound(view: catalog_pb2.View, settings: ProxySettings) -> listener_pb2.Listener | None:
    served = _served(view)
    if not served:
        return None
    plaintext = view.mesh.permissive
    inspect = plaintext or any(ingress.chained(p) for _, p in served)
    chains = []
    for pod_port, port in served:
        filters = listeners.inbound_filters(view, port, inbound_route_name(port))
        dport = wrappers_pb2.UInt32Value(value=pod_port)
        if ingress.chained(port):
            chain = ingress.filter_chain(port, listeners.ROUTER)
            chain.filter_chain_match.destination_port.CopyFrom(dport)
            chains.append(chain)
        chains.append(
            lc.FilterChain(
                name=f"inbound|{port.port}",
                filter_chain_match=lc.FilterChainMatch(
                    destination_port=dport, transport_protocol="tls" if inspect else ""
                ),
                filters=filters,
                transport_socket=downstream_mtls(),
            )
        )
        if plaintext:  # OSM's permissive mode: callers outside the mesh too
            chains.append(
                lc.FilterChain(
                    name=f"inbound-plaintext|{port.port}",
                    filter_chain_match=lc.FilterChainMatch(
                        destination_port=dport, transport_protocol="raw_buffer"
                    ),
                    filters=filters,
                )
            )
    listener = listener_pb2.Listener(
        name=names.INBOUND_LISTENER,
        address=socket_address(settings.inbound_address, settings.inbound_port),
        listener_filters=[_original_destination()],
        filter_chains=chains,
    )
    if inspect:
        listener.listener_filters.append(ingress.tls_inspector())
    return listener


def inbound_routes(view: catalog_pb2.View) -> list[route_pb2.RouteConfiguration]:
    return [
        routes.inbound(view, [port], inbound_route_name(port))
        for _, port in _served(view)
        if port.protocol in HTTP_PROTOCOLS
    ]
