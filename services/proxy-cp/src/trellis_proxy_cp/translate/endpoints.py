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
from trellis_common.memo import Members
from trellis_proxy_cp.translate.common import socket_address


def _locality(text: str) -> base_pb2.Locality:
    region, _, rest = text.partition("/")
    zone, _, sub_zone = rest.partition("/")
    return base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone)


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
        _lb_endpoints.retain(lambda name: False)
    _assignments[cluster.name] = (serialized, assignment)
    return assignment


def _assignment(cluster: catalog_pb2.Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    ordered = sorted(cluster.endpoints, key=lambda e: (e.locality, e.address, e.port))
    built = _lb_endpoints.convert(cluster.name, ordered)
    groups: dict[str, list[endpoint_components_pb2.LbEndpoint]] = defaultdict(list)
    weights: dict[str, int] = defaultdict(int)
    for endpoint, lb_endpoint in zip(ordered, built, strict=True):
        groups[endpoint.locality].append(lb_endpoint)
        weights[endpoint.locality] += max(endpoint.weight, 1)
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster.name,
        endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(
                locality=_locality(locality),
                load_balancing_weight=wrappers_pb2.UInt32Value(value=weights[locality]),
                lb_endpoints=members,
            )
            for locality, members in groups.items()  # in order: the endpoints were sorted
        ],
    )


def _lb_endpoint(
    endpoint: catalog_pb2.ClusterEndpoint, _: object
) -> endpoint_components_pb2.LbEndpoint:
    return endpoint_components_pb2.LbEndpoint(
        endpoint=endpoint_components_pb2.Endpoint(
            address=socket_address(endpoint.address, endpoint.port)
        ),
        load_balancing_weight=wrappers_pb2.UInt32Value(value=max(endpoint.weight, 1)),
    )


def _served_as(endpoint: catalog_pb2.ClusterEndpoint) -> tuple[str, int, int]:
    return endpoint.address, endpoint.port, endpoint.weight


#: per cluster name, its endpoints' messages by address, port and weight (the current
#: ones only: a churning service's past addresses are not kept)
_lb_endpoints: Members[str, catalog_pb2.ClusterEndpoint, endpoint_components_pb2.LbEndpoint]
_lb_endpoints = Members(_lb_endpoint, key=_served_as)


def is_eds(cluster: catalog_pb2.Cluster) -> bool:
    """Clusters are EDS unless DNS or passthrough (the one rule clusters.py also uses)."""
    return cluster.discovery not in ("DNS", "PASSTHROUGH")


def eds_clusters(view: catalog_pb2.View) -> list[catalog_pb2.Cluster]:
    return [c for c in view.clusters if is_eds(c)]


def load_assignments(view: catalog_pb2.View) -> list[endpoint_pb2.ClusterLoadAssignment]:
    return [load_assignment(c) for c in eds_clusters(view)]
