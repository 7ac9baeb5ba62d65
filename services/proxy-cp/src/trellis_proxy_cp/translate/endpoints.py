"""EDS: a ClusterLoadAssignment per EDS cluster, endpoints grouped by locality.

Each locality carries a ``load_balancing_weight`` (the sum of its endpoints' weights):
proxyless gRPC needs it (else "no children in weighted_target policy"), and Envoy uses it
with locality-weighted load balancing.

Locality failover (locality.py), where MeshConfig turns it on (``enableLocalityFailover``:
the view's ``mesh.locality_failover``): for a proxy that reports its locality, a cluster
with outlier detection (:func:`fails_over`) gets each locality's EDS ``priority`` relative
to the proxy's, so its assignment depends on where the proxy is. It is built and kept per
(cluster, proxy locality), not per proxy: every proxy of one locality shares it. For a
proxy without a locality, or a cluster without outlier detection, the assignment is the
one every proxy gets, with everything at priority 0.

Assignments are built by a :class:`LoadAssignments`, which keeps the last ones for reuse;
the control plane owns one (``core.ProxyControlPlane``), so the translate layer itself
keeps no state between calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import attrgetter, itemgetter

from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_common import messages
from trellis_common.memo import Members
from trellis_proxy_cp.translate import locality as localities
from trellis_proxy_cp.translate.common import socket_address

#: Cluster names whose last assignment is kept; past it, they are all forgotten at once.
KEPT_CLUSTERS = 65536

#: per cluster name, its endpoints' messages by locality, address, port and weight
LbEndpoints = Members[str, catalog_pb2.ClusterEndpoint, bytes]


#: catalog discoveries whose clusters Envoy resolves itself (STRICT_DNS, LOGICAL_DNS)
DNS = ("DNS", "LOGICAL_DNS")


def is_eds(cluster: catalog_pb2.Cluster) -> bool:
    """Clusters are EDS unless DNS or passthrough (the one rule clusters.py also uses)."""
    return cluster.discovery not in (*DNS, "PASSTHROUGH")


def eds_clusters(view: catalog_pb2.View) -> list[catalog_pb2.Cluster]:
    return [c for c in view.clusters if is_eds(c)]


def fails_over(cluster: catalog_pb2.Cluster) -> bool:
    """Whether the cluster's localities get priorities relative to the proxy: an EDS
    cluster (the others are resolved by Envoy, without localities) with outlier detection,
    the health signal that makes failover happen (locality.py says why)."""
    return (
        is_eds(cluster)
        and cluster.HasField("connection")
        and cluster.connection.HasField("outlier_detection")
    )


class LoadAssignments:
    """Load assignments of clusters, each cluster's last one kept for reuse.

    Every group whose view has a cluster translates it, and a view refreshed because one
    cluster moved carries all its others unchanged; so each cluster's last assignment is
    kept with the catalog's message it came from (its bytes), and endpoints on the wire by
    address, port and weight: one endpoint of 200 moved builds one endpoint message, and
    each locality's are merged from their kept bytes in one go. Only the current content of a
    cluster is kept, so memory follows the mesh, not its history of changes; past
    ``kept_clusters`` cluster names, everything is forgotten at once.

    An assignment returned is shared by every caller that asks for the same content: do
    not change it. Reuse is per object: the control plane owns one for all its groups, and
    a fresh one (as :func:`~trellis_proxy_cp.translate.proxy.translate` makes when given
    none) shares nothing with any other.
    """

    def __init__(self, kept_clusters: int = KEPT_CLUSTERS) -> None:
        self._kept_clusters = kept_clusters
        #: per cluster name and proxy locality ("" for the one without priorities): the
        #: catalog's message of the cluster (its bytes), and its assignment
        self._assignments: dict[
            tuple[str, str], tuple[bytes, endpoint_pb2.ClusterLoadAssignment]
        ] = {}
        #: the current endpoints of each cluster only: a churning service's past
        #: addresses are not kept
        self._lb_endpoints: LbEndpoints = Members(_lb_endpoint, key=_FIELDS)

    def __call__(
        self, cluster: catalog_pb2.Cluster, locality: str = ""
    ) -> endpoint_pb2.ClusterLoadAssignment:
        """The cluster's load assignment for a proxy at ``locality`` ("": unknown, or the
        mesh does not fail over by locality). Do not change it: it is shared."""
        if not fails_over(cluster):
            locality = ""  # the same for every proxy: kept once
        serialized = cluster.SerializeToString(deterministic=True)
        kept = self._assignments.get((cluster.name, locality))
        if kept is not None and kept[0] == serialized:
            return kept[1]
        assignment = endpoint_pb2.ClusterLoadAssignment.FromString(
            self.encode(cluster.name, cluster.endpoints, locality)
        )
        if len(self._assignments) >= self._kept_clusters:
            self._assignments.clear()  # clusters come and go: the ones still here come back
            self._lb_endpoints.retain(lambda name: False)
        self._assignments[cluster.name, locality] = (serialized, assignment)
        return assignment

    def of_view(
        self, view: catalog_pb2.View, locality: str = ""
    ) -> list[endpoint_pb2.ClusterLoadAssignment]:
        """The load assignments of the view's EDS clusters, in its order, for a proxy at
        ``locality``. Shared: do not change them."""
        if not view.mesh.locality_failover:
            locality = ""  # off mesh-wide (MeshConfig): every proxy gets the same
        return [self(c, locality) for c in eds_clusters(view)]

    def __len__(self) -> int:
        """How many assignments are kept (one per cluster name, and per proxy locality
        for a cluster that fails over)."""
        return len(self._assignments)

    @property
    def endpoints_built(self) -> int:
        """How many endpoint messages were built so far (the others were reused)."""
        return self._lb_endpoints.misses

    def encode(
        self, name: str, endpoints: Sequence[catalog_pb2.ClusterEndpoint], locality: str = ""
    ) -> bytes:
        """The load assignment of the cluster ``name`` with ``endpoints``, for a proxy at
        ``locality`` ("": everything at priority 0), serialized as protobuf writes it
        (fields in number order), from each endpoint's kept encoding: no message of the
        endpoints is made. The caller keeps it (this keeps only the endpoints)."""
        # each endpoint's fields read once (a field of a parsed message is slow to read)
        pairs = sorted(zip(map(_FIELDS, endpoints), endpoints, strict=True), key=_FIRST)
        fields = list(map(_FIRST, pairs))
        built = self._lb_endpoints.convert(name, map(_SECOND, pairs), keys=fields)
        where = list(map(_FIRST, fields))
        each = list(map(max, map(_WEIGHT, fields), repeat(1)))
        groups: dict[str, list[bytes]] = defaultdict(list)
        weights: dict[str, int] = defaultdict(int)
        if where and where.count(where[0]) == len(where):  # one locality: C does it all
            groups[where[0]], weights[where[0]] = built, sum(each)
        else:
            for at, lb_endpoint, weight in zip(where, built, each, strict=True):
                groups[at].append(lb_endpoint)
                weights[at] += weight
        priority = localities.priorities(locality, groups) if locality else {}
        parts = [endpoint_pb2.ClusterLoadAssignment(cluster_name=name).SerializeToString()]
        for at, members in groups.items():  # in order: the endpoints were sorted
            group = b"".join(
                (
                    _LocalityLbEndpoints(locality=_locality(at)).SerializeToString(),
                    messages.repeated(_LocalityLbEndpoints, "lb_endpoints", members),
                    _LocalityLbEndpoints(
                        load_balancing_weight=wrappers_pb2.UInt32Value(value=weights[at]),
                        priority=priority.get(at, 0),
                    ).SerializeToString(),
                )
            )
            parts.append(messages.field(_GROUPS, group))
        return b"".join(parts)


_LocalityLbEndpoints = endpoint_components_pb2.LocalityLbEndpoints
#: ``ClusterLoadAssignment.endpoints``' field number: the locality groups
_GROUPS = endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR.fields_by_name["endpoints"].number


def _locality(text: str) -> base_pb2.Locality:
    region, zone, sub_zone = localities.parts(text)
    return base_pb2.Locality(region=region, zone=zone, sub_zone=sub_zone)


def _lb_endpoint(endpoint: catalog_pb2.ClusterEndpoint, _: object) -> bytes:
    """The endpoint as Envoy's ``LbEndpoint`` on the wire (:mod:`trellis_common.messages`):
    a group's are merged into its ``lb_endpoints`` in one go."""
    return messages.delimited(
        endpoint_components_pb2.LbEndpoint(
            endpoint=endpoint_components_pb2.Endpoint(
                address=socket_address(endpoint.address, endpoint.port)
            ),
            load_balancing_weight=wrappers_pb2.UInt32Value(value=max(endpoint.weight, 1)),
        )
    )


#: an endpoint's fields, read once: its locality and address for the order (the endpoint's
#: memo key, all of them: C reads them, no Python frame per endpoint)
_FIELDS: Callable[[catalog_pb2.ClusterEndpoint], tuple[str, str, int, int]] = attrgetter(
    "locality", "address", "port", "weight"
)
_FIRST, _SECOND, _WEIGHT = itemgetter(0), itemgetter(1), itemgetter(3)
