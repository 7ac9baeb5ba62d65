"""EDS resources by (slice, cluster, locality) and version: translated and serialized once.

A slice's endpoints reach every group whose policy names it. Its ClusterLoadAssignment is
translated and serialized in one go, from each endpoint's kept encoding
(:meth:`~trellis_proxy_cp.translate.endpoints.LoadAssignments.encode`), once per slice
version, and the one :class:`~trellis_proxy_cp.cache.snapshot.Resource` is shared by every
snapshot that holds it: a change to one cluster's endpoints costs one assignment, whatever
the number of groups. A cluster that fails over by locality (``translate/locality.py``)
has one per proxy locality.

Only the current version of each key is kept, so memory follows the mesh, not its history;
keys of slices that are gone are forgotten by :meth:`EndpointResources.retain`.
"""

from __future__ import annotations

from collections.abc import Callable

from envoy.config.endpoint.v3 import endpoint_pb2

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import types
from trellis_proxy_cp.cache.snapshot import Resource, encoded_resource
from trellis_proxy_cp.translate.endpoints import LoadAssignments, fails_over

Key = tuple[str, str, str]  # slice name, cluster name, proxy locality ("": any)


class EndpointResources:
    def __init__(self, assignments: LoadAssignments | None = None) -> None:
        self.assignments = assignments if assignments is not None else LoadAssignments()
        self._kept: dict[Key, tuple[str, Resource]] = {}
        self.built = 0  # resources translated and serialized so far

    def __call__(
        self, cluster: pb.Cluster, found: pb.ClusterSlice | None, locality: str = ""
    ) -> Resource:
        """The load assignment of a policy's ``cluster`` with ``found``'s endpoints (none
        when ``found`` is None), for a proxy at ``locality`` ("": unknown, or the mesh does
        not fail over by locality)."""
        if not fails_over(cluster):
            locality = ""
        key = (cluster.slice, cluster.name, locality)
        version = found.version if found is not None else ""
        kept = self._kept.get(key)
        if kept is not None and kept[0] == version and version:
            return kept[1]
        endpoints = found.endpoints if found is not None else ()
        data = self.assignments.encode(cluster.name, endpoints, locality)
        resource = encoded_resource(
            types.ENDPOINT, cluster.name, data, endpoint_pb2.ClusterLoadAssignment
        )
        self._kept[key] = (version, resource)
        self.built += 1
        return resource

    def retain(self, wanted: Callable[[str], bool]) -> None:
        """Forget the resources of the slices ``wanted`` says no to."""
        for key in [k for k in self._kept if not wanted(k[0])]:
            del self._kept[key]

    def __len__(self) -> int:
        return len(self._kept)
