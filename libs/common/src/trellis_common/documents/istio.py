"""Istio ``ServiceEntry`` and ``WorkloadEntry`` documents: services the platform does not list.

A ServiceEntry adds hosts to the mesh's registry: an external API reached through DNS, VMs at
fixed IPs, a Unix socket on the client's host, or the WorkloadEntries its ``workloadSelector``
picks. The endpoints providers turn them into endpoints; this module decides which documents
are valid, once, with the rules of Istio's ``networking/v1alpha3/service_entry.proto`` and of
its validation, and with errors that point at the field (``spec.endpoints[1].address``).

Rules about one value are field validators. Rules relating fields (resolution and endpoint
addresses, endpoint port names and declared ports) run once the spec is built and report each
problem at its own location, by raising a ``ValidationError`` that pydantic nests under
``spec``. ``v1alpha3``, ``v1beta1`` and ``v1`` share these models: the fields did not change.

Stricter than Istio, on purpose: unknown fields are errors (usually typos), a locality has no
empty part and DNS_ROUND_ROBIN has at most one endpoint (Envoy's logical DNS cluster takes one).
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Callable, Iterator
from typing import Annotated, Final

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    StrictInt,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from trellis_common import ids
from trellis_common.documents.base import KindRegistry, Resource, StrictModel
from trellis_common.model import MAX_WEIGHT

API_VERSIONS: Final = tuple(f"networking.istio.io/{v}" for v in ("v1alpha3", "v1beta1", "v1"))
UNIX_PREFIX: Final = "unix://"
EXPORT_SAME_NAMESPACE: Final = "."
EXPORT_ALL: Final = "*"
EXPORT_NONE: Final = "~"
_WILDCARD_PREFIX: Final = "*."


class Location(enum.StrEnum):
    """Whether the service is part of the mesh (mTLS, server-side policy) or outside it."""

    MESH_EXTERNAL = "MESH_EXTERNAL"
    MESH_INTERNAL = "MESH_INTERNAL"


class Resolution(enum.StrEnum):
    """How the proxy finds the endpoints' IPs (not how the application resolves the host)."""

    NONE = "NONE"  # forward to the IP the connection was already bound to
    STATIC = "STATIC"  # the IPs (or unix:// sockets) listed in endpoints
    DNS = "DNS"  # resolve endpoint addresses, or the hosts if there are no endpoints
    DNS_ROUND_ROBIN = "DNS_ROUND_ROBIN"  # as DNS, but use the first answer (logical DNS)


class PortProtocol(enum.StrEnum):
    HTTP = "HTTP"
    HTTPS = "HTTPS"
    GRPC = "GRPC"
    HTTP2 = "HTTP2"
    MONGO = "MONGO"
    TCP = "TCP"
    TLS = "TLS"


_DNS_MODES: Final = frozenset({Resolution.DNS, Resolution.DNS_ROUND_ROBIN})
# Protocols whose traffic names its host (Host/:authority header or TLS SNI).
_HOST_AWARE: Final = frozenset(PortProtocol) - {PortProtocol.MONGO, PortProtocol.TCP}


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _identifier(check: Callable[[str, str], str], value: str, what: str = "") -> str:
    """``check`` (from ``ids``) with its ``InvalidIdentifier`` as the ValueError pydantic wants."""
    try:
        return check(value, "")
    except ids.InvalidIdentifier as exc:
        raise ValueError(f"{value!r} is not {what or 'a ' + exc.kind}: {exc.reason}") from None


def _dns_name(value: str) -> str:
    """DNS names are case-insensitive: keep them in lower case."""
    return _identifier(ids.validate_dns_subdomain, value.lower())


def _host(value: str) -> str:
    if value == "*":
        raise ValueError("'*' alone is not allowed: name the hosts ('*.example.com' for a domain)")
    if _is_ip(value):
        raise ValueError(f"{value!r} is an IP address: hosts are DNS names, IPs go in addresses")
    wildcard = value.startswith(_WILDCARD_PREFIX)
    rest = value.removeprefix(_WILDCARD_PREFIX)
    if "*" in rest:
        raise ValueError(f"{value!r}: a wildcard may only be the whole first label, '*.'")
    return (_WILDCARD_PREFIX if wildcard else "") + _dns_name(rest)


def _service_address(value: str) -> str:
    if value.startswith(UNIX_PREFIX):
        raise ValueError("Unix domain sockets are not supported here: list them in endpoints")
    try:
        address = ipaddress.ip_interface(value) if "/" in value else ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address or CIDR prefix") from None
    return str(address)


def _endpoint_address(value: str) -> str:
    if value.startswith(UNIX_PREFIX):
        path = value.removeprefix(UNIX_PREFIX)
        if not path.startswith("/") or path == "/":
            raise ValueError(f"{value!r}: a Unix socket must be unix:///absolute/path/to/socket")
        return value
    if _is_ip(value):
        return str(ipaddress.ip_address(value))
    if "*" in value:
        raise ValueError(f"{value!r}: an endpoint address must be fully qualified, not a wildcard")
    try:
        return _dns_name(value)
    except ValueError:
        reason = "is not an IP address, a DNS name or unix:///path/to/socket"
        raise ValueError(f"{value!r} {reason}") from None


def _between(low: int, high: int) -> AfterValidator:
    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(f"must be between {low} and {high}, got {value}")
        return value

    return AfterValidator(check)


def _dns_label(value: str) -> str:
    return _identifier(ids.validate_dns_label, value)


def _protocol(value: object) -> object:
    """Protocols are case-insensitive; an empty one means "not declared", as in Istio."""
    if value == "":
        return None
    if isinstance(value, str):
        if value.upper() in PortProtocol.__members__:
            return value.upper()
        raise ValueError(f"must be one of {', '.join(PortProtocol)}, got {value!r}")
    return value


def _locality(value: str) -> str:
    if value and not all(value.split("/")):
        raise ValueError(f"{value!r} must be region/zone/subzone, with no empty part")
    return value


def _service_account(value: str) -> str:
    return value and _identifier(ids.validate_dns_subdomain, value)


def _export_target(value: str) -> str:
    if value in (EXPORT_SAME_NAMESPACE, EXPORT_ALL, EXPORT_NONE):
        return value
    what = "'.', '*', '~' or a namespace name (a DNS-1123 label)"
    return _identifier(ids.validate_dns_label, value, what)


Host = Annotated[str, AfterValidator(_host)]
ServiceAddress = Annotated[str, AfterValidator(_service_address)]
EndpointAddress = Annotated[str, AfterValidator(_endpoint_address)]
PortNumber = Annotated[StrictInt, _between(1, 65535)]
PortName = Annotated[str, AfterValidator(_dns_label)]
Weight = Annotated[StrictInt, _between(0, MAX_WEIGHT)]
ExportTarget = Annotated[str, AfterValidator(_export_target)]


class ServicePort(StrictModel):
    """A port of the service; ``protocol`` None means not declared (Istio sniffs it)."""

    number: PortNumber
    protocol: Annotated[PortProtocol | None, BeforeValidator(_protocol)] = None
    name: PortName
    target_port: PortNumber | None = Field(default=None, alias="targetPort")

    @property
    def endpoint_port(self) -> int:
        """The port endpoints listen on unless they map this port's name to another."""
        return self.target_port or self.number


class WorkloadEntrySpec(StrictModel):
    """A workload (VM, bare-metal host) by address; also the shape of a ServiceEntry endpoint."""

    address: EndpointAddress
    ports: dict[PortName, PortNumber] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    network: str = ""
    locality: Annotated[str, AfterValidator(_locality)] = ""
    weight: Weight = 0  # 0: not set (Envoy's default)
    service_account: Annotated[str, AfterValidator(_service_account)] = Field(
        default="", alias="serviceAccount"
    )

    @property
    def is_unix(self) -> bool:
        return self.address.startswith(UNIX_PREFIX)

    def port_for(self, service_port_name: str) -> int | None:
        """The port this workload maps the named service port to, if it maps it.

        None means the endpoint uses the service port's ``endpoint_port``.
        """
        return self.ports.get(service_port_name)

    def locality_parts(self) -> tuple[str, str, str]:
        """``(region, zone, subzone)``, empty where not given; deeper parts join the subzone."""
        region, _, rest = self.locality.partition("/")
        zone, _, subzone = rest.partition("/")
        return region, zone, subzone


class WorkloadSelector(StrictModel):
    """Selects the WorkloadEntries (and pods) of the ServiceEntry's namespace by labels."""

    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not key:
                raise ValueError("a label key must not be empty")
            if "*" in key or "*" in label:
                raise ValueError(f"wildcards are not allowed in labels, got {key}={label}")
        return value


Problem = tuple[tuple[str | int, ...], str, object]
"""Where (relative to the spec), why, and the offending value."""


class ServiceEntrySpec(StrictModel):
    hosts: tuple[Host, ...]
    addresses: tuple[ServiceAddress, ...] = ()
    ports: tuple[ServicePort, ...]
    location: Location = Location.MESH_EXTERNAL
    resolution: Resolution = Resolution.NONE
    endpoints: tuple[WorkloadEntrySpec, ...] = ()
    workload_selector: WorkloadSelector | None = Field(default=None, alias="workloadSelector")
    export_to: tuple[ExportTarget, ...] = Field(default=(), alias="exportTo")
    subject_alt_names: tuple[Annotated[str, StringConstraints(min_length=1)], ...] = Field(
        default=(), alias="subjectAltNames"
    )

    @field_validator("hosts", "ports")
    @classmethod
    def _not_empty(cls, value: tuple[object, ...]) -> tuple[object, ...]:
        if not value:
            raise ValueError("must list at least one")
        return value

    @field_validator("export_to")
    @classmethod
    def _export_to(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a namespace twice: {list(value)}")
        for alone in (EXPORT_ALL, EXPORT_NONE):
            if alone in value and len(value) > 1:
                raise ValueError(f"{alone!r} must be the only entry, got {list(value)}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ServiceEntrySpec:
        problems = [*_port_problems(self), *_host_problems(self), *_endpoint_problems(self)]
        if problems:
            details = [
                InitErrorDetails(
                    type=PydanticCustomError("service_entry", "{reason}", {"reason": reason}),
                    loc=loc,
                    input=value,
                )
                for loc, reason, value in problems
            ]
            raise ValidationError.from_exception_data(type(self).__name__, details)
        return self

    def port_by_name(self, name: str) -> ServicePort | None:
        return next((port for port in self.ports if port.name == name), None)

    def limits(self) -> tuple[tuple[str, str], ...]:
        """What of this (valid) entry is served only in part, as ``(field, why)`` for its
        status: ``unix://`` endpoints only reach Envoy sidecars (the socket at that path on
        each sidecar's own host; gRPC's and Linkerd's clients take IP addresses only), names
        are only checked where the proxy makes the TLS connection (MESH_INTERNAL: mTLS),
        and Envoy's logical DNS resolves one name."""
        found = [
            (
                f"spec.endpoints[{index}].address",
                f"{endpoint.address!r} is served to Envoy sidecars only, as the socket at "
                "that path on each sidecar's own host; proxyless gRPC and Linkerd clients do "
                "not get it",
            )
            for index, endpoint in enumerate(self.endpoints)
            if endpoint.is_unix
        ]
        if self.subject_alt_names and self.location is Location.MESH_EXTERNAL:
            reason = (
                "not enforced for MESH_EXTERNAL: the sidecar does not make the TLS connection "
                "(the application does), so it checks no names"
            )
            found.append(("spec.subjectAltNames", reason))
        logical = self.resolution is Resolution.DNS_ROUND_ROBIN and not self.endpoints
        if logical and len(self.hosts) > 1:
            reason = (
                f"DNS_ROUND_ROBIN with {len(self.hosts)} hosts and no endpoints resolves as "
                "DNS (every address of every host): Envoy's logical DNS takes one name"
            )
            found.append(("spec.resolution", reason))
        return tuple(found)

    @staticmethod
    def is_wildcard_host(host: str) -> bool:
        return host.startswith(_WILDCARD_PREFIX)

    def exported_to(self, entry_namespace: str, consumer_namespace: str) -> bool:
        """Whether workloads of ``consumer_namespace`` see this entry (from ``entry_namespace``).

        No ``exportTo``: every namespace; ``.``: the entry's own; ``*``: every; ``~``: none
        (only the service's own proxies, which do not consume it); a name: that namespace.
        """
        if not self.export_to:
            return True
        same = consumer_namespace == entry_namespace
        return any(
            target in (EXPORT_ALL, consumer_namespace) or (target == EXPORT_SAME_NAMESPACE and same)
            for target in self.export_to
        )


def _port_problems(spec: ServiceEntrySpec) -> Iterator[Problem]:
    numbers: dict[int, int] = {}
    names: dict[str, int] = {}
    for index, port in enumerate(spec.ports):
        if port.number in numbers:
            reason = f"port {port.number} is already declared by ports[{numbers[port.number]}]"
            yield ("ports", index, "number"), reason, port.number
        if port.name in names:
            reason = f"port name {port.name!r} is already used by ports[{names[port.name]}]"
            yield ("ports", index, "name"), reason, port.name
        numbers.setdefault(port.number, index)
        names.setdefault(port.name, index)


def _host_problems(spec: ServiceEntrySpec) -> Iterator[Problem]:
    if spec.resolution is not Resolution.NONE and len(spec.hosts) > 1:
        blind = [port for port in spec.ports if port.protocol not in _HOST_AWARE]
        if blind:
            port = blind[0]
            reason = (
                f"several hosts need ports whose protocol names the host (HTTP, HTTPS, GRPC, "
                f"HTTP2 or TLS) unless resolution is NONE; port {port.name!r} is "
                f"{port.protocol or 'not declared'}"
            )
            yield ("hosts",), reason, list(spec.hosts)
    if spec.resolution in _DNS_MODES:
        for index, host in enumerate(spec.hosts):
            if not spec.endpoints and spec.is_wildcard_host(host):
                reason = (
                    f"{host!r} is a wildcard: with resolution {spec.resolution} and no endpoints "
                    "the proxy resolves the hosts, so they must be fully qualified"
                )
                yield ("hosts", index), reason, host
        for index, address in enumerate(spec.addresses):
            if "/" in address:
                reason = f"{address!r}: CIDR prefixes need resolution NONE or STATIC"
                yield ("addresses", index), reason, address


def _endpoint_problems(spec: ServiceEntrySpec) -> Iterator[Problem]:
    if not spec.endpoints:
        return
    count = len(spec.endpoints)
    if spec.workload_selector is not None:
        reason = "cannot be used with endpoints: list the endpoints or select WorkloadEntries"
        yield ("workloadSelector",), reason, spec.workload_selector.labels
    if spec.resolution is Resolution.NONE:
        reason = (
            "must be empty with resolution NONE: the proxy forwards each connection to the IP "
            "it was bound to; use STATIC or DNS to route to endpoints"
        )
        yield ("endpoints",), reason, count
        return
    if spec.resolution is Resolution.DNS_ROUND_ROBIN and count > 1:
        reason = f"DNS_ROUND_ROBIN uses one endpoint (Envoy's logical DNS), got {count}"
        yield ("endpoints",), reason, count
    declared = sorted(port.name for port in spec.ports)
    for index, endpoint in enumerate(spec.endpoints):
        where: tuple[str | int, ...] = ("endpoints", index)
        if endpoint.is_unix:
            if spec.resolution is not Resolution.STATIC:
                reason = f"{endpoint.address!r}: a unix:// socket needs resolution STATIC"
                yield (*where, "address"), reason, endpoint.address
            if endpoint.ports:
                yield (*where, "ports"), "must be empty for a unix:// endpoint", endpoint.ports
            continue
        if spec.resolution is Resolution.STATIC and not _is_ip(endpoint.address):
            reason = (
                f"{endpoint.address!r} is a DNS name: resolution STATIC needs IP addresses or "
                "unix:// sockets (resolution DNS resolves names)"
            )
            yield (*where, "address"), reason, endpoint.address
        for name, number in endpoint.ports.items():
            if name not in declared:
                reason = f"{name!r} names no port of this ServiceEntry ({', '.join(declared)})"
                yield (*where, "ports", name), reason, number
    if any(endpoint.is_unix for endpoint in spec.endpoints) and len(spec.ports) != 1:
        reason = f"must list exactly one port for unix:// endpoints, got {len(spec.ports)}"
        yield ("ports",), reason, len(spec.ports)


class ServiceEntry(Resource[ServiceEntrySpec]):
    pass


class WorkloadEntry(Resource[WorkloadEntrySpec]):
    pass


def register(registry: KindRegistry) -> None:
    """Let ``registry`` parse ServiceEntry and WorkloadEntry, in every API version."""
    registry.register("ServiceEntry", API_VERSIONS, ServiceEntry)
    registry.register("WorkloadEntry", API_VERSIONS, WorkloadEntry)
