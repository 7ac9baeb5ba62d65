"""The domain model of the mesh: the fundamental types of the OSM design, as values.

Every service passes these between its layers (the catalog builds them from SMI documents,
proxy-cp translates them to Envoy resources), so they are frozen, slotted dataclasses that
check themselves when built: an object that exists is valid, and code further on does not
check again. Collections are tuples, so every value is hashable and can key a dict or sit in
a set (the catalog indexes by service, the xDS cache by identity).

Names follow the OSM design's appendix ("Fundamental Types") and its catalog types, with
Python spellings: ``ServiceAccount`` is the design's ``NamespacedServiceAccount`` (also called
``K8sServiceAccount``), ``RoutePolicy.methods`` its ``Methods``, ``TrafficPolicy.route_paths``
its ``PolicyRoutePaths``. Identifiers are checked by ``ids`` and raise ``InvalidIdentifier``;
other bad values raise ``InvalidModel``. Both are ``ValueError``s that name the field.

Pydantic belongs to the edges (YAML documents, REST bodies); they convert to these types.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final, Literal, NewType, get_args

from trellis_common import ids

ClusterName = NewType("ClusterName", str)
"""The name of an Envoy cluster backing a service."""

TrafficResourceKind = Literal["ServiceAccount", "Service"]

ANY_METHOD: Final = "*"
HTTP_METHODS: Final = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
MAX_WEIGHT: Final = 2**32 - 1  # Envoy weights are uint32

_HEADER_NAME: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 token


class InvalidModel(ValueError):
    """A value of the domain model breaks a rule; ``field`` says which value."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field} {value!r} is not valid: {reason}")

    def __reduce__(self) -> tuple[type[InvalidModel], tuple[str, object, str]]:
        return type(self), (self.field, self.value, self.reason)


def _split_namespaced(text: str, field: str) -> tuple[str, str]:
    namespace, slash, name = text.partition("/")
    if not slash or "/" in name:
        reason = "must have the form '<namespace>/<name>'"
        raise ids.InvalidIdentifier(field, text, reason, "namespaced name")
    return namespace, name


def _check_weight(value: int, field: str = "weight") -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidModel(field, value, "must be an integer")
    if not 0 <= value <= MAX_WEIGHT:
        raise InvalidModel(field, value, f"must be between 0 and {MAX_WEIGHT}")


def _check_instance(value: object, expected: type, field: str) -> None:
    if not isinstance(value, expected):
        raise InvalidModel(field, value, f"must be a {expected.__name__}")


def _check_tuple_of(value: tuple[object, ...], expected: type, field: str) -> None:
    if not isinstance(value, tuple):
        raise InvalidModel(field, value, f"must be a tuple of {expected.__name__}")
    for index, item in enumerate(value):
        _check_instance(item, expected, f"{field}[{index}]")


@dataclass(frozen=True, slots=True)
class MeshService:
    """A service of the mesh, named within its namespace; ``str()`` is ``ns/name``."""

    namespace: str
    name: str

    def __post_init__(self) -> None:
        ids.validate_dns_label(self.namespace, "namespace")
        ids.validate_dns_label(self.name, "service name")

    @classmethod
    def parse(cls, text: str) -> MeshService:
        return cls(*_split_namespaced(text, "mesh service"))

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """A Kubernetes-style service account: the identity that SMI TrafficTargets authorize."""

    namespace: str
    name: str

    def __post_init__(self) -> None:
        ids.validate_dns_label(self.namespace, "namespace")
        ids.validate_dns_subdomain(self.name, "service account")

    @classmethod
    def parse(cls, text: str) -> ServiceAccount:
        return cls(*_split_namespaced(text, "service account"))

    def spiffe_id(self, trust_domain: str) -> ids.SpiffeId:
        return ids.SpiffeId(trust_domain, self.namespace, self.name)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An IP and port serving a service; ``ip`` is kept in its normalized spelling."""

    ip: str
    port: int

    def __post_init__(self) -> None:
        if not isinstance(self.ip, str):
            raise InvalidModel("endpoint ip", self.ip, "must be a string")
        try:
            address = ipaddress.ip_address(self.ip)
        except ValueError:
            raise InvalidModel("endpoint ip", self.ip, "must be an IPv4 or IPv6 address") from None
        object.__setattr__(self, "ip", str(address))
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise InvalidModel("endpoint port", self.port, "must be an integer")
        if not 1 <= self.port <= 65535:
            raise InvalidModel("endpoint port", self.port, "must be between 1 and 65535")

    def __str__(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True, order=True)
class ReportedEndpoint:
    """What an endpoints provider reports of one endpoint (the provider API's ``Endpoint``):
    the catalog's and endpoints-vm's endpoint records both start from it."""

    address: str
    ports: tuple[tuple[str, int], ...]  # (port name, number)
    labels: tuple[tuple[str, str], ...] = ()
    locality: str = ""
    weight: int = 1
    service_account: str = ""
    workload: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceReach:
    """How a provider says a service is reached: an Istio ServiceEntry's hosts, addresses,
    location and resolution (a plain service keeps the defaults). The catalog's and
    endpoints-vm's service records both carry it."""

    hosts: tuple[str, ...] = ()
    addresses: tuple[str, ...] = ()
    location: str = "MESH_INTERNAL"
    resolution: str = "STATIC"
    export_to: tuple[str, ...] = ()
    subject_alt_names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WeightedService:
    """A service and its weight in a traffic split."""

    service: MeshService
    weight: int

    def __post_init__(self) -> None:
        _check_instance(self.service, MeshService, "service")
        _check_weight(self.weight)


@dataclass(frozen=True, slots=True)
class WeightedCluster:
    """A cluster and its weight among the clusters backing a service."""

    cluster: ClusterName
    weight: int

    def __post_init__(self) -> None:
        if not isinstance(self.cluster, str) or not self.cluster:
            raise InvalidModel("cluster name", self.cluster, "must be a non-empty string")
        _check_weight(self.weight)


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """An HTTP route: a path regex, the allowed methods (``*`` for any) and header matches.

    ``path_regex`` is checked with Python's ``re``; Envoy uses RE2, which refuses a few
    constructs ``re`` accepts (backreferences, lookaround), so translation may still report one.
    """

    path_regex: str
    methods: tuple[str, ...]
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.path_regex, str):
            raise InvalidModel("path regex", self.path_regex, "must be a string")
        try:
            re.compile(self.path_regex)
        except re.error as err:
            raise InvalidModel("path regex", self.path_regex, f"does not compile: {err}") from None
        _check_tuple_of(self.methods, str, "methods")
        if not self.methods:
            reason = f"must name at least one method ({ANY_METHOD!r} for any)"
            raise InvalidModel("methods", self.methods, reason)
        for method in self.methods:
            if method != ANY_METHOD and method not in HTTP_METHODS:
                reason = f"must be {ANY_METHOD!r} or one of {', '.join(sorted(HTTP_METHODS))}"
                raise InvalidModel("method", method, reason)
        _check_tuple_of(self.headers, tuple, "headers")
        for header in self.headers:
            if len(header) != 2 or not all(isinstance(part, str) for part in header):
                raise InvalidModel("header", header, "must be a (name, value) pair of strings")
            if _HEADER_NAME.fullmatch(header[0]) is None:
                raise InvalidModel("header name", header[0], "must be a non-empty HTTP token")


@dataclass(frozen=True, slots=True)
class TrafficResource:
    """A source or destination of a traffic policy: a service account or a service."""

    kind: TrafficResourceKind
    namespace: str
    name: str

    def __post_init__(self) -> None:
        kinds = get_args(TrafficResourceKind)
        if self.kind not in kinds:
            raise InvalidModel("traffic resource kind", self.kind, f"must be one of {kinds}")
        ids.validate_dns_label(self.namespace, "namespace")
        if self.kind == "Service":
            ids.validate_dns_label(self.name, "service name")
        else:
            ids.validate_dns_subdomain(self.name, "service account")


@dataclass(frozen=True, slots=True)
class TrafficTarget:
    """An SMI TrafficTarget: which service accounts may call ``destination``, on which routes.

    As in OSM, the destination must live in the TrafficTarget's own namespace.
    """

    name: str
    namespace: str
    destination: ServiceAccount
    sources: tuple[ServiceAccount, ...]
    routes: tuple[RoutePolicy, ...]

    def __post_init__(self) -> None:
        ids.validate_dns_subdomain(self.name, "traffic target name")
        ids.validate_dns_label(self.namespace, "namespace")
        _check_instance(self.destination, ServiceAccount, "destination")
        if self.destination.namespace != self.namespace:
            reason = f"must be the traffic target's namespace {self.namespace!r}"
            raise InvalidModel("destination namespace", self.destination.namespace, reason)
        _check_tuple_of(self.sources, ServiceAccount, "sources")
        _check_tuple_of(self.routes, RoutePolicy, "routes")


@dataclass(frozen=True, slots=True)
class TrafficPolicy:
    """The routes allowed from one source to one destination (OSM's ``TrafficPolicy``)."""

    policy_name: str
    destination: TrafficResource
    source: TrafficResource
    route_paths: tuple[RoutePolicy, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.policy_name, str) or not self.policy_name:
            raise InvalidModel("policy name", self.policy_name, "must be a non-empty string")
        _check_instance(self.destination, TrafficResource, "destination")
        _check_instance(self.source, TrafficResource, "source")
        _check_tuple_of(self.route_paths, RoutePolicy, "route paths")
