"""Egress: calls to hosts outside the mesh.

An application on a VM reaches the mesh through its sidecar as an HTTP proxy, so the
sidecar sees the host it wants in the request (or in CONNECT, for HTTPS and raw TCP).

- MeshConfig ``enableEgress`` on: Envoy's dynamic forward proxy resolves whatever host the
  request names and forwards it: a catch-all virtual host on the outbound route
  configuration, after every mesh destination.
- Off: only what OSM Egress policies allow (the view's ``egress``, see
  :func:`virtual_hosts`): an ``http`` host on its port (``host:port``, and the bare host
  for port 80), its requests narrowed by the policies' HTTPRouteGroups; a CONNECT to an
  ``https`` host's ``host:port``; a CONNECT to an address of a ``tcp`` rule's ranges on its
  port (any host or address when there are none). A named host gets its own STRICT_DNS
  cluster ``egress|<protocol>|<host>:<port>`` (OSM's per-host clusters, with the
  UpstreamTrafficSetting the policy names as circuit breakers); a wildcard host or an
  address range goes through a dynamic forward proxy cluster of the same kind of name.

Anything else gets 404 from the sidecar: denied.
"""

from __future__ import annotations

import ipaddress

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.clusters.dynamic_forward_proxy.v3 import cluster_pb2 as dfp_cluster_pb2
from envoy.extensions.common.dynamic_forward_proxy.v3 import dns_cache_pb2
from envoy.extensions.filters.http.dynamic_forward_proxy.v3 import dynamic_forward_proxy_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.type.matcher.v3 import regex_pb2, string_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.common import one_endpoint, pack, seconds

DNS_CACHE = "trellis-egress"


def dns_cache() -> dns_cache_pb2.DnsCacheConfig:
    return dns_cache_pb2.DnsCacheConfig(
        name=DNS_CACHE, dns_lookup_family=cluster_pb2.Cluster.V4_PREFERRED
    )


def cluster(name: str = names.EGRESS) -> cluster_pb2.Cluster:
    """A dynamic forward proxy cluster: it connects to the host the request names."""
    return cluster_pb2.Cluster(
        name=name,
        connect_timeout=seconds(5.0),
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        cluster_type=cluster_pb2.Cluster.CustomClusterType(
            name="envoy.clusters.dynamic_forward_proxy",
            typed_config=pack(dfp_cluster_pb2.ClusterConfig(dns_cache_config=dns_cache())),
        ),
    )


def http_filter() -> hcm.HttpFilter:
    return hcm.HttpFilter(
        name="envoy.filters.http.dynamic_forward_proxy",
        typed_config=pack(dynamic_forward_proxy_pb2.FilterConfig(dns_cache_config=dns_cache())),
    )


def connect_route(name: str, cluster: str, authority: str = "") -> rc.Route:
    """A CONNECT tunnel to ``cluster``; ``authority``: an RE2 regex the CONNECT target
    (``address:port``) must match."""
    match = rc.RouteMatch(connect_matcher=rc.RouteMatch.ConnectMatcher())
    if authority:
        match.headers.append(
            rc.HeaderMatcher(
                name=":authority",
                string_match=string_pb2.StringMatcher(
                    safe_regex=regex_pb2.RegexMatcher(regex=authority)
                ),
            )
        )
    return rc.Route(
        name=name,
        match=match,
        route=rc.RouteAction(
            cluster=cluster,
            timeout=seconds(0),  # a tunnel lives as long as its connection
            upgrade_configs=[
                rc.RouteAction.UpgradeConfig(
                    upgrade_type="CONNECT",
                    connect_config=rc.RouteAction.UpgradeConfig.ConnectConfig(),
                )
            ],
        ),
    )


def virtual_host() -> rc.VirtualHost:
    return rc.VirtualHost(
        name="egress",
        domains=["*"],
        routes=[
            connect_route("egress-connect", names.EGRESS),
            rc.Route(
                name="egress",
                match=rc.RouteMatch(prefix="/"),
                route=rc.RouteAction(cluster=names.EGRESS),
            ),
        ],
    )


def cluster_name(route: catalog_pb2.EgressRoute) -> str:
    return f"egress|{route.protocol}|{route.host or '*'}:{route.port}"


def forwarded(route: catalog_pb2.EgressRoute) -> bool:
    """The route's cluster is a dynamic forward proxy: no single host to resolve."""
    return not route.host or route.host.startswith("*.")


def forward_proxy(view: catalog_pb2.View) -> bool:
    """The outbound connection manager needs the dynamic forward proxy filter."""
    return view.mesh.egress or any(forwarded(r) for r in view.egress)


def route_cluster(route: catalog_pb2.EgressRoute) -> cluster_pb2.Cluster:
    """The cluster of an Egress route (circuit breakers are the caller's: clusters.py)."""
    name = cluster_name(route)
    if forwarded(route):
        return cluster(name)
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STRICT_DNS,
        dns_lookup_family=cluster_pb2.Cluster.V4_PREFERRED,
        connect_timeout=seconds(5.0),
        load_assignment=one_endpoint(name, route.host, route.port),
    )


def _octets(low: int, high: int) -> str:
    if low == 0 and high == 255:
        return "[0-9]{1,3}"
    if low == high:
        return str(low)
    return "(" + "|".join(str(n) for n in range(low, high + 1)) + ")"


def cidr_regex(cidr: str) -> str:
    """An RE2 regex for the dotted IPv4 addresses of ``cidr`` (octet by octet)."""
    network = ipaddress.IPv4Network(cidr, strict=False)
    first = network.network_address.packed
    last = network.broadcast_address.packed
    return r"\.".join(_octets(a, b) for a, b in zip(first, last, strict=True))


def authority(route: catalog_pb2.EgressRoute) -> str:
    """The regex a CONNECT target must match for a route by address ranges ("": any)."""
    if not route.ip_ranges:
        return ""
    addresses = "|".join(f"({cidr_regex(r)})" for r in route.ip_ranges)
    return f"({addresses}):{route.port}"


def domains(route: catalog_pb2.EgressRoute) -> list[str]:
    """The Host/authority values a route answers: ``host:port`` (and the bare host on
    port 80, as HTTP clients write it), or any host on the port."""
    if not route.host:
        return [f"*:{route.port}"]
    found = [f"{route.host}:{route.port}"]
    if route.protocol == "http" and route.port == 80:
        found.append(route.host)
    return found


__all__ = [
    "authority",
    "cidr_regex",
    "cluster",
    "cluster_name",
    "connect_route",
    "dns_cache",
    "domains",
    "forward_proxy",
    "http_filter",
    "route_cluster",
    "virtual_host",
]
