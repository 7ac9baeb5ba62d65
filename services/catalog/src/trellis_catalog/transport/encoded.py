"""Slices and destinations on the wire, encoded once per version.

A watch answer (``WatchChanges``) carries the moved slices and destinations inline. Each is
written here as a serialized ``Resource`` the first time it is asked for at a version, and
that encoding is what every answer carrying it sends (every proxy-cp replica's watch, and
the fetches that follow) until the resource moves: the answer is joined from bytes, and no
message of 200 endpoints is made, copied and serialized again per watch. The endpoints come
from :class:`~.protos.SliceProtos`, one encoding per endpoint while it is the same object.
Policies are not kept: their body depends on the service account the asker gives.
"""

from __future__ import annotations

from trellis_api import catalog_pb2 as pb
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.model import contentversion
from trellis_catalog.domain.publish.resources import DESTINATION, SLICE, slice_of
from trellis_catalog.transport.protos import SliceProtos, destination_bytes
from trellis_common import messages
from trellis_common.model import MeshService

_BODY = {
    SLICE: pb.Resource.DESCRIPTOR.fields_by_name["slice"].number,
    DESTINATION: pb.Resource.DESCRIPTOR.fields_by_name["destination"].number,
}
#: ``ListChangesResponse.resources``' field number: an answer's inline resources.
INLINE_FIELD = pb.ListChangesResponse.DESCRIPTOR.fields_by_name["resources"].number


class EncodedResources:
    """The catalog's slices and destinations as serialized ``Resource`` messages, kept by
    name while their version stands (see the module docstring)."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.slices = SliceProtos()
        self._kept: dict[str, tuple[str, bytes]] = {}  # name -> (what it was made of, bytes)

    def __len__(self) -> int:
        return len(self._kept)

    def prune(self) -> None:
        """Forget resources that are gone, once they may outnumber those that are not."""
        versions = self._catalog.resources.versions
        self.slices.prune(versions)
        if len(self._kept) > 2 * len(versions) + 64:
            self._kept = {n: kept for n, kept in self._kept.items() if n in versions}

    def get(self, name: str) -> bytes | None:
        """The slice or destination ``name`` as it is now, a serialized ``Resource``; None
        if there is no such resource (or ``name`` is a policy's)."""
        kind, _, rest = name.partition("/")
        if kind == SLICE:
            return self._slice(name, rest)
        if kind == DESTINATION:
            return self._destination(name, rest)
        return None

    def _slice(self, name: str, rest: str) -> bytes | None:
        catalog = self._catalog
        cluster, _, limited = rest.rpartition("@") if "@" in rest else (rest, "", "")
        state = catalog.clusters.get(cluster)
        if state is None and name not in catalog.resources.versions:
            return None  # no such cluster, and no policy references it
        made_of = state.version if state is not None else contentversion.ABSENT
        kept = self._kept.get(name)
        if kept is not None and kept[0] == made_of:
            return kept[1]
        accounts = tuple(limited.split(",")) if limited else ()
        version = contentversion.of((made_of, accounts))
        body = self.slices.encode(name, slice_of(state, cluster, accounts), version)
        return self._keep(name, made_of, version, SLICE, body)

    def _destination(self, name: str, rest: str) -> bytes | None:
        destinations = self._catalog.destinations
        namespace, _, service_name = rest.partition("/")
        service = MeshService(namespace, service_name)
        record = destinations.records.get(service)
        if record is None:
            return None
        version = destinations.versions[service]
        kept = self._kept.get(name)
        if kept is not None and kept[0] == version:
            return kept[1]
        body = destination_bytes(record, version, self._catalog.clusters, self.slices)
        return self._keep(name, version, version, DESTINATION, body)

    def _keep(self, name: str, made_of: str, version: str, kind: str, body: bytes) -> bytes:
        head = pb.Resource(name=name, version=version).SerializeToString()
        encoded = head + messages.field(_BODY[kind], body)
        self._kept[name] = (made_of, encoded)
        return encoded
