"""EDS: a ClusterLoadAssignment per EDS cluster, endpoints grouped by locality.

Each locality carries a ``load_balancing_weight`` (the sum of its endpoints' weights):
proxyless gRPC needs it (else "no children in weighted_target policy"), and Envoy uses it
with locality-weighted load balancing.
"""

from __future__ import annotations

import functools
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


#: Endpoint messages kept by address, port and weight (see load_assignment).
KEPT_ENDPOINTS = 65536
#: Cluster names whose last assignment is kept; past it, they are all forgotten at once.
KEPT_CLUSTERS = 65536

#: per cluster name: the catalog's message of it (its bytes), and its assignment
_assignments: dict[str, tuple[bytes, endpoint_pb2.ClusterLoadAssignment]] = {}


def load_assignment(cluster: catalog_pb2.Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    """The cluster's load assignment. Do not change it: it is shared.

    Every group whose view has a cluster translates it, and a view refreshed because one
    cluster moved carries all its others unchanged; so each cluster's last assignment is
    kept with the catalog's message it came from (its bytes), and endpoint messages by
    address, port and weight: one endpoint of 200 moved builds one endpoint message, the
    others are copies made by the protobuf runtime. Only the current content of a
    cluster is kept, so memory follows the mesh, not its history of changes.
    """
    serialized = cluster.SerializeToString(deterministic=True)
    kept = _assignments.get(cluster.name)
    if kept is not None and kept[0] == serialized:
        return kept[1]
    assignment = _assignment(cluster)
    if len(_assignments) >= KEPT_CLUSTERS:
        _assignments.clear()  # clusters come and go: the ones still here come back
    _assignments[cluster.name] = (serialized, assignment)
    return assignment


def _assignment(cluster: catalog_pb2.Cluster) -> endpoint_pb2.ClusterLoadAssignment:
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
                    _lb_endpoint(e.address, e.port, max(e.weight, 1))
                    for e in sorted(members, key=lambda e: (e.address, e.port))
                ],
            )
            for locality, members in sorted(by_locality.items())
        ],
    )


@functools.lru_cache(maxsize=KEPT_ENDPOINTS)
def _lb_endpoint(address: str, port: int, weight: int) -> endpoint_components_pb2.LbEndpoint:
    return endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(address=socket_address(address, port)),
        load_balancing_weight=wrappers_pb2.UInt32Value(value=weight),
    )


def is_eds(cluster: catalog_pb2.Cluster) -> bool:
    """Clusters are EDS unless DNS or passthrough (the one rule clusters.py also uses)."""
    return cluster.discovery not in ("DNS", "PASSTHROUGH")


def eds_clusters(view: catalog_pb2.View) -> list[catalog_pb2.Cluster]:
    return [c for c in view.clusters if is_eds(c)]


def load_assignments(view: catalog_pb2.View) -> list[endpoint_pb2.ClusterLoadAssignment]:
    return [load_assignment(c) for c in eds_clusters(view)]
