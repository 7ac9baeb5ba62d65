"""A snapshot: one version of every Envoy resource one group of proxies gets, by type URL.

As in go-control-plane's ``pkg/cache/v3/snapshot.go``, a :class:`Snapshot` is a version plus
the resources by type, and :meth:`Snapshot.consistent` says whether Envoy could warm it
(every EDS cluster has its ClusterLoadAssignment, every RDS name its RouteConfiguration,
every SDS name its Secret). The cache refuses inconsistent snapshots.

A :class:`Resource` is serialized exactly once, when it is made (or made from its bytes:
:func:`encoded_resource`): its content hash is its version, and it keeps the encoding of its
``Any``. Snapshots built from the same :class:`Resource` objects share them, so a resource
common to every proxy of an identity (or unchanged between two snapshots) is never
serialized again; transports join its encoded entries into their responses.

Each type has its own version (:meth:`Snapshot.version_of`), a hash of that type's resource
versions: a snapshot change pushes only the types whose version changed, and a proxy sees a
version that moves only when what it was sent moves.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from google.protobuf import any_pb2
from google.protobuf.message import Message

from trellis_common import messages
from trellis_proxy_cp.cache import references
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ORDER, ROUTE, SECRET, TypeUrl

_PREFIX = "type.googleapis.com/"


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=8).hexdigest()


@dataclasses.dataclass(frozen=True, eq=False)
class Resource:
    """One named resource, serialized once. Equal when type, name and content are equal.

    It holds its encoding only: ``body`` (the message) is parsed from it when first asked
    for, unless the resource was made from the message, and ``delta_entry`` is encoded
    when a delta stream first sends it."""

    name: str
    type_url: TypeUrl
    version: str
    #: the resource as an entry of a DiscoveryResponse's ``resources`` (field 2): its
    #: ``Any``, encoded
    entry: bytes
    message_type: type[Message]
    _body: Message | None = dataclasses.field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Resource):
            return NotImplemented
        return (self.type_url, self.name, self.version) == (
            other.type_url,
            other.name,
            other.version,
        )

    def __hash__(self) -> int:
        return hash((self.type_url, self.name, self.version))

    @property
    def packed(self) -> bytes:
        """The resource's ``Any``, encoded (its entry without the entry's key and length)."""
        at = 1  # the key, one byte (field 2)
        while self.entry[at] & 0x80:  # the length's varint
            at += 1
        return self.entry[at + 1 :]

    @property
    def any(self) -> any_pb2.Any:
        return any_pb2.Any.FromString(self.packed)

    @property
    def body(self) -> Message:
        """The resource's message. Shared: do not change it."""
        if self._body is None:
            body = self.message_type.FromString(self.any.value)
            object.__setattr__(self, "_body", body)
            return body
        return self._body

    @functools.cached_property
    def delta_entry(self) -> bytes:
        """The resource as an entry of a DeltaDiscoveryResponse's ``resources`` (field 2):
        a ``Resource`` with its name, version and ``Any``, encoded."""
        fields = (
            messages.field(_DELTA_VERSION, self.version.encode()),
            messages.field(_DELTA_RESOURCE, self.packed),
            messages.field(_DELTA_NAME, self.name.encode()),
        )
        return messages.field(_RESOURCES, b"".join(fields))


#: a delta ``Resource``'s fields
_DELTA_VERSION, _DELTA_RESOURCE, _DELTA_NAME = 1, 2, 3


def make_resource(type_url: TypeUrl, message: Message, name: str | None = None) -> Resource:
    """Serialize ``message`` once (deterministically) and wrap it.

    The name is ``message.name`` (``cluster_name`` for a ClusterLoadAssignment) unless given.
    """
    if name is None:
        fields = message.DESCRIPTOR.fields_by_name
        name = str(getattr(message, "name" if "name" in fields else "cluster_name", ""))
    data = message.SerializeToString(deterministic=True)
    return encoded_resource(type_url, name, data, type(message), message)


def encoded_resource(
    type_url: TypeUrl,
    name: str,
    data: bytes,
    message_type: type[Message],
    body: Message | None = None,
) -> Resource:
    """A resource of ``message_type`` serialized as ``data`` (its ``body``, if given, is
    that message: else it is parsed when first asked for)."""
    full_name = message_type.DESCRIPTOR.full_name
    if type_url != _PREFIX + full_name:
        raise ValueError(f"type URL {type_url!r} does not match message type {full_name!r}")
    if not name:
        raise ValueError(f"a {full_name} resource needs a name")
    packed = messages.field(1, type_url.encode()) + messages.field(2, data)
    entry = messages.field(_RESOURCES, packed)
    return Resource(name, type_url, _digest(data), entry, message_type, body)


def _type_version(resources: Mapping[str, Resource]) -> str:
    lines = "".join(f"{name}\0{r.version}\n" for name, r in sorted(resources.items()))
    return _digest(lines.encode())


EMPTY_VERSION = _type_version({})
"""The per-type version of a type with no resources."""

_NO_RESOURCES: Mapping[str, Resource] = MappingProxyType({})


@dataclasses.dataclass(frozen=True, eq=False)
class Snapshot:
    """A version and the resources by type URL and name. Immutable; compared by identity."""

    version: str
    resources: Mapping[TypeUrl, Mapping[str, Resource]]
    _versions: Mapping[TypeUrl, str] = dataclasses.field(init=False, repr=False)
    # serialized responses (see response): built once per type and names, shared by streams
    _responses: dict[tuple[TypeUrl, tuple[str, ...] | None], tuple[bytes, int]] = dataclasses.field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        frozen: dict[TypeUrl, Mapping[str, Resource]] = {}
        for type_url, by_name in self.resources.items():
            for name, resource in by_name.items():
                if resource.name != name or resource.type_url != type_url:
                    raise ValueError(
                        f"resource {resource.type_url} {resource.name!r} "
                        f"filed as {type_url} {name!r}"
                    )
            if by_name:
                frozen[type_url] = MappingProxyType(dict(by_name))
        object.__setattr__(self, "resources", MappingProxyType(frozen))
        versions = {t: _type_version(by_name) for t, by_name in frozen.items()}
        object.__setattr__(self, "_versions", MappingProxyType(versions))

    @classmethod
    def of(cls, version: str, resources: Iterable[Resource]) -> Snapshot:
        """Group resources by type URL; two resources of one type and name are an error."""
        grouped: dict[TypeUrl, dict[str, Resource]] = {}
        for resource in resources:
            by_name = grouped.setdefault(resource.type_url, {})
            if resource.name in by_name:
                raise ValueError(f"duplicate {resource.type_url} resource {resource.name!r}")
            by_name[resource.name] = resource
        return cls(version=version, resources=grouped)

    def version_of(self, type_url: TypeUrl) -> str:
        """This type's version: it changes exactly when one of its resources changes."""
        return self._versions.get(type_url, EMPTY_VERSION)

    def of_type(self, type_url: TypeUrl) -> Mapping[str, Resource]:
        """The resources of one type by name (empty if there are none)."""
        return self.resources.get(type_url, _NO_RESOURCES)

    def response(self, type_url: TypeUrl, names: tuple[str, ...] | None) -> tuple[bytes, int]:
        """The state-of-the-world ``DiscoveryResponse`` of ``type_url`` for ``names`` (sorted;
        None: every resource of the type) serialized, without its nonce, and how many
        resources it holds. Built once per snapshot, type and names: the streams of one
        group (and most of them ask for the same names) share the bytes, and each adds only
        its nonce (:func:`with_nonce`)."""
        key = (type_url, names)
        found = self._responses.get(key)
        if found is None:
            available = self.of_type(type_url)
            chosen = [available[n] for n in (sorted(available) if names is None else names)
                      if n in available]  # fmt: skip
            # the message's fields in number order, as protobuf writes them: the resources
            # are their encoded entries, joined (each was encoded once, when made)
            response = b"".join(
                (
                    messages.field(_VERSION_INFO, self.version_of(type_url).encode()),
                    *(resource.entry for resource in chosen),
                    messages.field(_TYPE_URL, type_url.encode()),
                )
            )
            found = self._responses[key] = (response, len(chosen))
        return found

    def with_type(
        self, type_url: TypeUrl, by_name: Mapping[str, Resource], version: str
    ) -> Snapshot:
        """This snapshot, as ``version``, with the resources of one type replaced by
        ``by_name`` under the same names (an endpoints-only change): the other types are
        shared as they are, and it is as consistent as this one. Raises ``ValueError``
        if the names differ."""
        if set(by_name) != set(self.of_type(type_url)):
            raise ValueError(f"with_type keeps the names of {type_url}")
        derived = object.__new__(Snapshot)
        resources = dict(self.resources)
        versions = dict(self._versions)
        if by_name:
            resources[type_url] = MappingProxyType(dict(by_name))
            versions[type_url] = _type_version(by_name)
        else:  # a type with no resources is left out, as __post_init__ leaves it
            resources.pop(type_url, None)
            versions.pop(type_url, None)
        object.__setattr__(derived, "version", version)
        object.__setattr__(derived, "resources", MappingProxyType(resources))
        object.__setattr__(derived, "_versions", MappingProxyType(versions))
        object.__setattr__(derived, "_responses", {})
        return derived

    def type_urls(self) -> list[TypeUrl]:
        """Type URLs with resources, in push order (:data:`ORDER` first, then the rest)."""
        return sorted(self.resources, key=_push_rank)

    def consistent(self) -> list[str]:
        """Problems that would leave Envoy warming; empty when the snapshot is consistent."""
        problems: list[str] = []
        endpoints, routes, secrets = (
            self.of_type(ENDPOINT),
            self.of_type(ROUTE),
            self.of_type(SECRET),
        )
        for name, cluster in sorted(self.of_type(CLUSTER).items()):
            body: Any = cluster.body
            eds = references.eds_service_name(body)
            if eds is not None and eds not in endpoints:
                problems.append(f"cluster {name!r} (EDS) has no ClusterLoadAssignment {eds!r}")
            for secret in sorted(set(references.cluster_secret_names(body))):
                if secret not in secrets:
                    problems.append(f"cluster {name!r} names missing secret {secret!r}")
        for name, listener in sorted(self.of_type(LISTENER).items()):
            body = listener.body
            for route in sorted(set(references.route_config_names(body))):
                if route not in routes:
                    problems.append(f"listener {name!r} names missing RouteConfiguration {route!r}")
            for secret in sorted(set(references.listener_secret_names(body))):
                if secret not in secrets:
                    problems.append(f"listener {name!r} names missing secret {secret!r}")
        return problems


_VERSION_INFO, _RESOURCES, _TYPE_URL, _NONCE = 1, 2, 4, 5  # DiscoveryResponse's fields


def with_nonce(response: bytes, nonce: str) -> bytes:
    """A serialized message with field 5 (``nonce``, a string) set: its bytes appended (a
    field not in ``response`` yet, so appending it is setting it, per the protobuf wire
    format)."""
    encoded = nonce.encode()
    size, length = len(encoded), bytearray()
    while size > 0x7F:  # varint
        length.append(size & 0x7F | 0x80)
        size >>= 7
    length.append(size)
    return b"".join((response, bytes(((_NONCE << 3) | 2,)), bytes(length), encoded))


def _push_rank(type_url: TypeUrl) -> tuple[int, str]:
    return (ORDER.index(type_url) if type_url in ORDER else len(ORDER), type_url)


def push_order(type_urls: Iterable[TypeUrl]) -> list[TypeUrl]:
    """Type URLs sorted the way Envoy needs them: CDS, EDS, LDS, RDS, SDS, then any other."""
    return sorted(type_urls, key=_push_rank)
