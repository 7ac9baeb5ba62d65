"""EDS: a ClusterLoadAssignment per EDS cluster, endpoints grouped by locality.

Each locality carries a ``load_balancing_weight`` (the sum of its endpoints' weights):
proxyless gRPC needs it (else "no children in weighted_target policy"), and Envoy uses it
with locality-weighted load balancing.
"""

from __future__ import annotations

from collections import defaultdict

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate.common import socket_address


def _locality(text: str) -> base_pb2.Locality:
    region, _, rest = text.partition("/")
    zone, _, sub_zone = rest.partition("/")
    return base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone)


def load_assignment(cluster: catalog_pb2.Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    by_locality: dict[str, list[catalog_pb2.ClusterEndpoint]] = defaultdict(list)
    for endpoint in cluster.endpoints:
        by_locality[endpoint.locality].append(endpoint)
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster.name,
        endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(
                locality=_locality(locality),
                load_balancing_weight=wrappers_pb2.UInt32Value(
                    value=sum(max(e.weight, 1) for e in members)
                ),
                lb_endpoints=[
                    endpoint_components_pb2.LbEndpoint(
                        endpoint=endpoint_components_pb2.Endpoint(
                            address=socket_address(e.address, e.port)
                        ),
                        load_balancing_weight=wrappers_pb2.UInt32Value(value=max(e.weight, 1)),
                    )
                    for e in sorted(members, key=lambda e: (e.address, e.port))
                ],
            )
            for locality, members in sorted(by_locality.items())
        ],
    )


def is_eds(cluster: catalog_pb2.Cluster) -> bool:
    """Clusters are EDS unless DNS or passthrough (the one rule clusters.py also uses)."""
    return cluster.discovery not in ("DNS", "PASSTHROUGH")


def eds_clusters(view: catalog_pb2.View) -> list[catalog_pb2.Cluster]:
    return [c for c in view.clusters if is_eds(c)]


def load_assignments(view: catalog_pb2.View) -> list[endpoint_pb2.ClusterLoadAssignment]:
    return [load_assignment(c) for c in eds_clusters(view)]
