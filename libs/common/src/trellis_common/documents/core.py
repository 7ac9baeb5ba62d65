"""Kubernetes core ``v1`` kinds the mesh reads: ``Service`` and ``ServiceAccount``.

A ``Service`` names a set of workloads and the ports they serve; a ``ServiceAccount`` is the
identity SMI ``TrafficTarget``\\ s authorize. Both are checked as Kubernetes checks them (port
numbers, port names unique DNS labels when there are several, target ports as numbers or
IANA service names), so a manifest that ``kubectl apply`` accepts reads the same here.

Fields of ``ServiceSpec`` that Kubernetes defines but the mesh does not use
(``sessionAffinity``, ``ipFamilies``, ...) are accepted and ignored, so real manifests can be
copied as they are; any other field is an error, because it is usually a typo.

Which protocol a port speaks is decided by :meth:`ServicePort.resolved_protocol`, following
OSM: ``appProtocol`` first, then the port name's prefix, then HTTP.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Final, Literal, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from trellis_common import ids
from trellis_common.documents.base import KindRegistry, Resource, StrictModel

PortProtocol = Literal["http", "http2", "grpc", "tcp", "udp", "sctp"]
"""What a port speaks, as the proxy must treat it."""

CORE_API_VERSIONS: Final = ("v1",)
MAX_PORT: Final = 65535

# Kubernetes ServiceSpec fields that do not concern the mesh: read and dropped.
_IGNORED_SPEC_FIELDS: Final = frozenset(
    {
        "allocateLoadBalancerNodePorts",
        "clusterIPs",
        "externalIPs",
        "externalName",
        "externalTrafficPolicy",
        "healthCheckNodePort",
        "internalTrafficPolicy",
        "ipFamilies",
        "ipFamilyPolicy",
        "loadBalancerClass",
        "loadBalancerIP",
        "loadBalancerSourceRanges",
        "publishNotReadyAddresses",
        "sessionAffinity",
        "sessionAffinityConfig",
        "trafficDistribution",
    }
)
_APP_PROTOCOLS: Final[dict[str, PortProtocol]] = {
    "http": "http",
    "http2": "http2",
    "kubernetes.io/h2c": "http2",
    "grpc": "grpc",
    "tcp": "tcp",
    "kubernetes.io/ws": "http",
}
_NAME_PREFIXES: Final[tuple[tuple[str, PortProtocol], ...]] = (
    ("http2", "http2"),
    ("http", "http"),
    ("grpc", "grpc"),
    ("tcp", "tcp"),
)
_IANA_SVC_NAME_MAX: Final = 15
_IANA_SVC_NAME: Final = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


def _invalid(loc: tuple[str | int, ...], reason: str, value: object) -> NoReturn:
    """Fail validation at ``loc`` (relative to the model being validated) with ``reason``."""
    error = PydanticCustomError("invalid", "{reason}", {"reason": reason})
    details = InitErrorDetails(type=error, loc=loc, input=value)
    raise ValidationError.from_exception_data("document", [details])


def _check_port_number(value: int) -> int:
    if not 1 <= value <= MAX_PORT:
        raise ValueError(f"must be between 1 and {MAX_PORT}, got {value}")
    return value


def _check_port_name(value: str) -> str:
    """A named target port: an IANA service name, as Kubernetes requires."""
    if len(value) > _IANA_SVC_NAME_MAX:
        raise ValueError(f"must be no more than {_IANA_SVC_NAME_MAX} characters, got {value!r}")
    if _IANA_SVC_NAME.fullmatch(value) is None:
        reason = "must consist of lower case letters, digits or '-', starting and ending with "
        raise ValueError(f"{reason}a letter or digit, got {value!r}")
    if "--" in value or not any(c.isalpha() for c in value):
        raise ValueError(f"must contain a letter and no '--', got {value!r}")
    return value


class ServicePort(StrictModel):
    """One port of a Service; ``target_port`` is a number or the name of a workload's port."""

    name: str | None = None
    port: StrictInt
    target_port: int | str | None = Field(default=None, alias="targetPort")
    protocol: Literal["TCP", "UDP", "SCTP"] = "TCP"
    app_protocol: str | None = Field(default=None, alias="appProtocol")
    node_port: StrictInt | None = Field(default=None, alias="nodePort")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if not value:
            return None
        try:
            return ids.validate_dns_label(value, "port name")
        except ids.InvalidIdentifier as exc:
            raise ValueError(exc.reason) from None

    @field_validator("port", "node_port")
    @classmethod
    def _number(cls, value: int | None) -> int | None:
        return None if value is None else _check_port_number(value)

    @field_validator("target_port", mode="plain")
    @classmethod
    def _target_port(cls, value: object) -> int | str | None:
        if value is None:
            return None
        if isinstance(value, int) and not isinstance(value, bool):
            return _check_port_number(value)
        if isinstance(value, str):
            return _check_port_name(value)
        raise ValueError("must be a port number or the name of a workload's port")

    @field_validator("app_protocol")
    @classmethod
    def _app_protocol(cls, value: str | None) -> str | None:
        return value or None

    @property
    def target(self) -> int | str:
        """Where traffic goes on the workload: ``targetPort``, or ``port`` when it is unset."""
        return self.port if self.target_port is None else self.target_port

    def resolved_protocol(self) -> PortProtocol:
        """The protocol the proxy must treat this port as.

        Non-TCP ports answer ``"udp"``/``"sctp"``. Otherwise ``appProtocol`` decides when set
        (``http``, ``http2``, ``kubernetes.io/h2c``, ``grpc``, ``tcp``, ``kubernetes.io/ws``;
        any other value, e.g. ``https`` or ``mysql``, is a protocol the proxy must not parse,
        so ``"tcp"``). Then the name: ``<protocol>`` or ``<protocol>-<suffix>`` for
        ``http``, ``http2``, ``grpc`` and ``tcp`` (the Istio/OSM convention). Anything else,
        an unnamed port included, is ``"http"``, as in OSM.
        """
        if self.protocol != "TCP":
            return "udp" if self.protocol == "UDP" else "sctp"
        if self.app_protocol is not None:
            return _APP_PROTOCOLS.get(self.app_protocol.lower(), "tcp")
        name = (self.name or "").lower()
        for prefix, protocol in _NAME_PREFIXES:
            if name == prefix or name.startswith(prefix + "-"):
                return protocol
        return "http"

    def protocol_is_declared(self) -> bool:
        """The protocol comes from ``appProtocol`` or the port's name, not the HTTP default
        (a GRPCRoute's backend port without either is gRPC)."""
        if self.protocol != "TCP" or self.app_protocol is not None:
            return True
        name = (self.name or "").lower()
        return any(name == p or name.startswith(p + "-") for p, _ in _NAME_PREFIXES)


class ServiceSpec(StrictModel):
    ports: tuple[ServicePort, ...] = ()
    selector: dict[str, str] = Field(default_factory=dict)
    cluster_ip: str | None = Field(default=None, alias="clusterIP")
    type: Literal["ClusterIP", "NodePort", "LoadBalancer", "ExternalName"] | None = None

    @model_validator(mode="before")
    @classmethod
    def _drop_unused_kubernetes_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k not in _IGNORED_SPEC_FIELDS}
        return data

    @field_validator("cluster_ip")
    @classmethod
    def _cluster_ip(cls, value: str | None) -> str | None:
        if not value:
            return None
        if value == "None":
            return value
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            raise ValueError(f"must be an IP address or 'None' (headless), got {value!r}") from None

    @model_validator(mode="after")
    def _ports(self) -> ServiceSpec:
        if not self.ports and not self.headless and self.type != "ExternalName":
            reason = "a Service needs at least one port unless it is headless or ExternalName"
            _invalid(("ports",), reason, [])
        several = len(self.ports) > 1
        names: dict[str, int] = {}
        numbers: dict[tuple[int, str], int] = {}
        for index, port in enumerate(self.ports):
            if several and port.name is None:
                _invalid(
                    ("ports", index, "name"), "is required when a Service has several ports", None
                )
            if port.name is not None and port.name in names:
                reason = f"{port.name!r} is also the name of ports[{names[port.name]}]"
                _invalid(("ports", index, "name"), reason, port.name)
            number = (port.port, port.protocol)
            if number in numbers:
                reason = f"{port.port}/{port.protocol} is also ports[{numbers[number]}]"
                _invalid(("ports", index, "port"), reason, port.port)
            if port.name is not None:
                names[port.name] = index
            numbers[number] = index
        return self

    @property
    def headless(self) -> bool:
        return self.cluster_ip == "None"


class Service(Resource[ServiceSpec]):
    """A Kubernetes ``v1`` Service."""

    @model_validator(mode="after")
    def _name_is_dns_1035_label(self) -> Service:
        name = self.metadata.name
        try:
            ids.validate_dns_label(name, "service name")
        except ids.InvalidIdentifier as exc:
            _invalid(("metadata", "name"), f"a Service name is a DNS label: it {exc.reason}", name)
        if not name[0].isalpha():
            _invalid(("metadata", "name"), "a Service name must start with a letter", name)
        return self

    def port_by_name(self, name: str) -> ServicePort | None:
        """The port named ``name``, or ``None``."""
        return next((port for port in self.spec.ports if port.name == name), None)

    def port_by_number(self, number: int, protocol: str = "TCP") -> ServicePort | None:
        """The port ``number``/``protocol``, or ``None``."""
        return next(
            (p for p in self.spec.ports if p.port == number and p.protocol == protocol), None
        )


class NoSpec(StrictModel):
    """The spec of kinds that have none."""


class ServiceAccount(Resource[NoSpec]):
    """A Kubernetes ``v1`` ServiceAccount: only its name and namespace matter to the mesh.

    Kubernetes' ServiceAccount has no ``spec`` (its ``secrets`` and
    ``automountServiceAccountToken`` are ignored); ``spec`` is there only to share the envelope.
    """

    spec: NoSpec = Field(default_factory=NoSpec)

    @field_validator("spec", mode="before")
    @classmethod
    def _no_spec(cls, value: object) -> object:
        if value is None or value == {}:
            return {}
        raise ValueError("a ServiceAccount has no spec; remove it")


class NamespaceSpec(BaseModel):
    """A Namespace's spec (``finalizers``): nothing the mesh reads."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class Namespace(Resource[NamespaceSpec]):
    """A Kubernetes ``v1`` Namespace: its labels decide which namespaces a Gateway
    listener's ``allowedRoutes.namespaces.selector`` admits routes from."""

    spec: NamespaceSpec = Field(default_factory=NamespaceSpec)

    def selector_labels(self) -> dict[str, str]:
        """Its labels, with the one Kubernetes sets on every namespace."""
        return {**self.metadata.labels, "kubernetes.io/metadata.name": self.metadata.name}


def register(registry: KindRegistry) -> None:
    registry.register("Service", CORE_API_VERSIONS, Service)
    registry.register("ServiceAccount", CORE_API_VERSIONS, ServiceAccount)
    registry.register("Namespace", CORE_API_VERSIONS, Namespace)
