"""Egress: calls to hosts outside the mesh, when MeshConfig ``enableEgress`` allows them.

An application on a VM reaches the mesh through its sidecar as an HTTP proxy, so the
sidecar sees the host it wants in the request (or in CONNECT, for HTTPS). Envoy's dynamic
forward proxy resolves that host and forwards the request: a catch-all virtual host on the
outbound route configuration, after every mesh destination. Without egress, an unknown
host gets 404 from the sidecar: denied.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.extensions.clusters.dynamic_forward_proxy.v3 import cluster_pb2 as dfp_cluster_pb2
from envoy.extensions.common.dynamic_forward_proxy.v3 import dns_cache_pb2
from envoy.extensions.filters.http.dynamic_forward_proxy.v3 import dynamic_forward_proxy_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)

from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.common import pack, seconds

DNS_CACHE = "trellis-egress"


def _dns_cache() -> dns_cache_pb2.DnsCacheConfig:
    return dns_cache_pb2.DnsCacheConfig(
        name=DNS_CACHE, dns_lookup_family=cluster_pb2.Cluster.V4_PREFERRED
    )


def cluster() -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=names.EGRESS,
        connect_timeout=seconds(5.0),
        lb_policy=cluster_pb2.Cluster.CLUSTER_PROVIDED,
        cluster_type=cluster_pb2.Cluster.CustomClusterType(
            name="envoy.clusters.dynamic_forward_proxy",
            typed_config=pack(dfp_cluster_pb2.ClusterConfig(dns_cache_config=_dns_cache())),
        ),
    )


def http_filter() -> hcm.HttpFilter:
    return hcm.HttpFilter(
        name="envoy.filters.http.dynamic_forward_proxy",
        typed_config=pack(dynamic_forward_proxy_pb2.FilterConfig(dns_cache_config=_dns_cache())),
    )


def virtual_host() -> rc.VirtualHost:
    return rc.VirtualHost(
        name="egress",
        domains=["*"],
        routes=[
            rc.Route(
                name="egress-connect",
                match=rc.RouteMatch(connect_matcher=rc.RouteMatch.ConnectMatcher()),
                route=rc.RouteAction(
                    cluster=names.EGRESS,
                    upgrade_configs=[
                        rc.RouteAction.UpgradeConfig(
                            upgrade_type="CONNECT",
                            connect_config=rc.RouteAction.UpgradeConfig.ConnectConfig(),
                        )
                    ],
                ),
            ),
            rc.Route(
                name="egress",
                match=rc.RouteMatch(prefix="/"),
                route=rc.RouteAction(cluster=names.EGRESS),
            ),
        ],
    )


__all__ = ["cluster", "http_filter", "virtual_host"]
