"""LDS and RDS of a Gateway API Gateway's Envoy: one listener per port of the Gateway.

The catalog gives a gateway identity its ports (``view.gateway_ports``): on each, every
Gateway listener there (a *server*), all of one protocol, with the attached HTTPRoutes' and
GRPCRoutes' rules already grouped into virtual hosts by host name (each ending with its
404) and their backends in ``view.clusters``, reached over mesh mTLS like a sidecar's
outbound clusters. Here each port becomes a listener ``gateway_<port>`` on 0.0.0.0:

- ``HTTP``: one HTTP connection manager whose route configuration (over RDS,
  ``gateway_<port>``) holds every server's virtual hosts. Its codec is AUTO, so HTTP/1.1
  and HTTP/2 cleartext (a gRPC client's h2c, prior knowledge) are both served;
  ``ignore_port_in_host_matching`` lets ``Host: foo.example.com:8080`` match
  ``foo.example.com`` while the backend still gets the Host header as sent (upstream's
  conformance checks it).
- ``HTTPS`` (``Terminate``): a TLS inspector, and a filter chain per server matching its
  hostname as the TLS server name (a server without one is the chain for any name); each
  chain terminates TLS with the server's certificates (SDS, files the Envoy reads itself:
  secrets.py), offers h2 and http/1.1 by ALPN, asks for no client certificate, and routes
  with that server's virtual hosts only (RDS ``gateway_<port>_<server index>``). Without a
  ``gateway_certs_dir`` in the node metadata the Envoy has no certificates: the port is left
  out, with a warning.
- ``TLS`` (``Passthrough``, TLSRoutes): a TLS inspector, and a filter chain per route
  matching its server names (SNI), whose ``tcp_proxy`` passes the connection, still
  encrypted, to the route's weighted clusters (mesh mTLS around it, as for a TCP service).

The routes are the Gateway API rules as every proxy gets them (gateway.py, with
``routes.route_match``); the catalog has placed each rule in the virtual hosts of its host
names, so they are not grouped again here. What would make Envoy refuse the whole listener
or route configuration is dropped with a warning instead (a domain already taken, two
chains for one server name, a port out of range or twice, a certificate reference that is not a
Kubernetes name), so one bad Gateway listener does not take the others down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import gateway, ingress, listeners, names, routes, secrets
from trellis_proxy_cp.translate.common import TLS_SOCKET, pack, sds, socket_address

log = logging.getLogger(__name__)

ADDRESS = "0.0.0.0"
ALPN = ("h2", "http/1.1")
HCM = "envoy.filters.network.http_connection_manager"


@dataclass(frozen=True, slots=True)
class GatewayResources:
    """A gateway's listeners, their route configurations, and the Secrets (namespace, name)
    their filter chains serve (secrets.gateway_certificates makes their SDS secrets)."""

    listeners: list[listener_pb2.Listener] = field(default_factory=list)
    routes: list[route_pb2.RouteConfiguration] = field(default_factory=list)
    certificates: list[tuple[str, str]] = field(default_factory=list)


def resources(view: catalog_pb2.View, certs_dir: str) -> GatewayResources:
    """Every port of the gateway's view; none when the Gateway is gone (no ports)."""
    found = GatewayResources()
    seen: set[int] = set()
    for port in view.gateway_ports:
        name = names.gateway_listener(port.port)
        if not 1 <= port.port <= 65535 or port.port in seen:
            log.warning("gateway_port_invalid identity=%s port=%d", view.identity, port.port)
        elif port.protocol == "HTTP":
            seen.add(port.port)
            _http(view, port, found)
        elif port.protocol == "HTTPS":
            seen.add(port.port)
            _https(view, port, certs_dir, found)
        elif port.protocol == "TLS":
            seen.add(port.port)
            _passthrough(view, port, found)
        else:
            log.info(
                "gateway_port_not_served identity=%s listener=%s protocol=%s",
                view.identity,
                name,
                port.protocol,
            )
    return found


def _tcp_proxy(port: int, route: catalog_pb2.GatewayTlsRoute) -> listener_components_pb2.Filter:
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=f"gateway_{port}_passthrough")
    if len(route.clusters) == 1:
        proxy.cluster = route.clusters[0].cluster
    else:
        proxy.weighted_clusters.CopyFrom(
            tcp_proxy_pb2.TcpProxy.WeightedCluster(
                clusters=[
                    tcp_proxy_pb2.TcpProxy.WeightedCluster.ClusterWeight(
                        name=c.cluster, weight=c.weight
                    )
                    for c in route.clusters
                ]
            )
        )
    return listener_components_pb2.Filter(
        name="envoy.filters.network.tcp_proxy", typed_config=pack(proxy)
    )


def _passthrough(
    view: catalog_pb2.View, port: catalog_pb2.GatewayPort, found: GatewayResources
) -> None:
    """TLSRoutes by server name; Envoy refuses two chains for one name, so a name already
    taken stays with the first."""
    listener = _listener(port.port)
    taken: set[str] = set()
    for server in port.servers:
        for route in server.tls_routes:
            server_names = [n for n in dict.fromkeys(route.hostnames) if n not in taken]
            clusters = [c for c in route.clusters if c.cluster and c.weight > 0]
            if not server_names or not clusters:
                log.warning(
                    "gateway_tls_route_not_served identity=%s server=%s route=%s",
                    view.identity,
                    server.listener,
                    route.source,
                )
                continue
            taken.update(server_names)
            served = catalog_pb2.GatewayTlsRoute(hostnames=server_names, clusters=clusters)
            listener.filter_chains.append(
                listener_components_pb2.FilterChain(
                    name=f"{server.listener}|{route.source}",
                    filter_chain_match=listener_components_pb2.FilterChainMatch(
                        transport_protocol="tls", server_names=server_names
                    ),
                    filters=[_tcp_proxy(port.port, served)],
                )
            )
    if not listener.filter_chains:  # Envoy refuses a listener without any
        log.warning("gateway_listener_empty identity=%s listener=%s", view.identity, listener.name)
        return
    listener.listener_filters.append(ingress.tls_inspector())
    found.listeners.append(listener)


def _route(source: catalog_pb2.Route) -> rc.Route:
    return gateway.route(source, routes.route_match(source.match), None)


def _virtual_hosts(
    view: catalog_pb2.View, servers: Iterable[catalog_pb2.GatewayServer]
) -> list[rc.VirtualHost]:
    """The servers' virtual hosts, in order; Envoy refuses a domain twice in one route
    configuration, so a domain already taken stays with the first."""
    taken: set[str] = set()
    found = []
    for server in servers:
        for index, host in enumerate(server.virtual_hosts):
            domains = [d for d in dict.fromkeys(host.domains) if d not in taken]
            if len(domains) < len(host.domains):
                log.warning(
                    "gateway_domain_taken identity=%s server=%s domains=%s",
                    view.identity,
                    server.listener,
                    ",".join(d for d in host.domains if d in taken),
                )
            if not domains:
                continue
            taken.update(domains)
            found.append(
                rc.VirtualHost(
                    name=f"{server.listener}|{index}",
                    domains=domains,
                    routes=[_route(r) for r in host.routes],
                )
            )
    return found


def _route_config(
    view: catalog_pb2.View, name: str, servers: Iterable[catalog_pb2.GatewayServer]
) -> route_pb2.RouteConfiguration:
    return route_pb2.RouteConfiguration(
        name=name,
        virtual_hosts=_virtual_hosts(view, servers),
        # an invalid backend's share names a cluster that never exists (gateway.py)
        validate_clusters=wrappers_pb2.BoolValue(value=False),
        ignore_port_in_host_matching=True,
    )


def _manager_filter(
    view: catalog_pb2.View, stat_prefix: str, route_config: str
) -> listener_components_pb2.Filter:
    manager = listeners.build_manager(view, stat_prefix, route_config, [])
    manager.use_remote_address.value = True  # the edge: the client's address is the peer's
    return listener_components_pb2.Filter(name=HCM, typed_config=pack(manager))


def _listener(port: int) -> listener_pb2.Listener:
    return listener_pb2.Listener(
        name=names.gateway_listener(port), address=socket_address(ADDRESS, port)
    )


def _http(view: catalog_pb2.View, port: catalog_pb2.GatewayPort, found: GatewayResources) -> None:
    route_name = names.gateway_routes(port.port)
    found.routes.append(_route_config(view, route_name, port.servers))
    listener = _listener(port.port)
    listener.filter_chains.append(
        listener_components_pb2.FilterChain(
            filters=[_manager_filter(view, f"gateway_{port.port}", route_name)]
        )
    )
    found.listeners.append(listener)


def _terminate(refs: list[tuple[str, str]]) -> base_pb2.TransportSocket:
    """TLS with the server's certificates; no client certificate asked for."""
    context = tls_pb2.DownstreamTlsContext(
        require_client_certificate=wrappers_pb2.BoolValue(value=False),
        common_tls_context=tls_pb2.CommonTlsContext(
            tls_certificate_sds_secret_configs=[sds(names.gateway_cert(*ref)) for ref in refs],
            alpn_protocols=list(ALPN),
        ),
    )
    return base_pb2.TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def _servable(
    view: catalog_pb2.View, listener: str, server: catalog_pb2.GatewayServer, taken: set[str]
) -> list[tuple[str, str]]:
    """The certificates of an HTTPS server the listener can serve; none: leave it out."""
    detail = f"identity={view.identity} listener={listener} server={server.listener}"
    if server.tls_mode != "Terminate":
        log.info("gateway_server_not_served %s tls_mode=%s", detail, server.tls_mode or "-")
        return []
    if server.hostname in taken:
        log.warning("gateway_server_name_taken %s hostname=%s", detail, server.hostname or "*")
        return []
    refs = [(c.namespace, c.name) for c in server.certificates]
    good = [ref for ref in dict.fromkeys(refs) if secrets.servable(*ref)]
    if len(good) < len(set(refs)):
        log.warning("gateway_certificate_ref_invalid %s", detail)
    if not good:
        log.warning("gateway_server_without_certificate %s", detail)
    return good


def _https(
    view: catalog_pb2.View,
    port: catalog_pb2.GatewayPort,
    certs_dir: str,
    found: GatewayResources,
) -> None:
    listener = _listener(port.port)
    if not certs_dir:
        log.warning(
            "gateway_https_not_served identity=%s listener=%s reason=no_gateway_certs_dir",
            view.identity,
            listener.name,
        )
        return
    taken: set[str] = set()
    for index, server in enumerate(port.servers):
        refs = _servable(view, listener.name, server, taken)
        if not refs:
            continue
        taken.add(server.hostname)
        route_name = names.gateway_routes(port.port, index)
        found.routes.append(_route_config(view, route_name, [server]))
        found.certificates.extend(r for r in refs if r not in found.certificates)
        listener.filter_chains.append(
            listener_components_pb2.FilterChain(
                name=server.listener,
                filter_chain_match=listener_components_pb2.FilterChainMatch(
                    transport_protocol="tls",
                    server_names=[server.hostname] if server.hostname else [],
                ),
                filters=[_manager_filter(view, f"gateway_{port.port}_{index}", route_name)],
                transport_socket=_terminate(refs),
            )
        )
    if not listener.filter_chains:  # Envoy refuses a listener without any
        log.warning("gateway_listener_empty identity=%s listener=%s", view.identity, listener.name)
        return
    listener.listener_filters.append(ingress.tls_inspector())
    found.listeners.append(listener)
