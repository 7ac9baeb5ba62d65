"""Gateway API north-south kinds: ``GatewayClass``, ``Gateway``, ``TLSRoute`` and
``ReferenceGrant`` (``gateway.networking.k8s.io``).

Trellis serves the Gateways whose GatewayClass names the controller ``trellis.dev/gateway``:
each gets a gateway Envoy (:mod:`trellis_catalog.domain.routing.gateways` resolves what it serves).
The models follow the upstream v1 API (``apis/v1/gateway_types.go``,
``gatewayclass_types.go``, ``apis/v1beta1/referencegrant_types.go``, bundle v1.6.1), the
CRDs' validation rules included, so a manifest the API server would refuse is an error here
too, naming the field:

- a Gateway has 1 to 64 listeners with unique names, and a unique (port, protocol,
  hostname) each;
- ``tls`` is not set for HTTP, TCP and UDP; HTTPS takes only ``Terminate``; TLS needs a
  mode; ``Terminate`` needs ``certificateRefs`` (or ``options``);
- TCP and UDP listeners have no hostname;
- a protocol is a core name (``HTTP``) or a domain-prefixed one (``example.com/foo``);
- ``allowedRoutes.namespaces.from`` is All, Same (the default) or Selector, and Selector
  needs a selector.

Fields Trellis reads but does not act on (addresses, infrastructure, the frontend and backend
TLS settings, listener sets) are kept, and the Gateway's status says what is not supported.
Whether a listener's protocol is served, a certificate exists, a reference is permitted, is
the catalog's business: it answers with conditions rather than refusing the document.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from trellis_common.documents.base import KindRegistry, Resource, StrictModel
from trellis_common.documents.gateway import GROUP, ParentReference
from trellis_common.documents.gateway_filters import (
    BackendObjectReference,
    Hostname,
    Weight,
    _hostname,
)
from trellis_common.documents.smi import Namespace, ObjectName, Port, _invalid

GATEWAY_CLASS_API_VERSIONS: Final = (f"{GROUP}/v1", f"{GROUP}/v1beta1")
GATEWAY_API_VERSIONS: Final = (f"{GROUP}/v1", f"{GROUP}/v1beta1")
REFERENCE_GRANT_API_VERSIONS: Final = (f"{GROUP}/v1beta1", f"{GROUP}/v1")
TLS_ROUTE_API_VERSIONS: Final = (f"{GROUP}/v1alpha2", f"{GROUP}/v1")

#: The controllerName of Trellis' GatewayClass.
CONTROLLER: Final = "trellis.dev/gateway"

_LABEL: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SECTION_NAME: Final = re.compile(rf"{_LABEL}(\.{_LABEL})*")
_PROTOCOL: Final = re.compile(
    r"[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"
    r"|[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]+"
)
_CONTROLLER: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+"
)
_KIND: Final = re.compile(r"[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?")


def _section_name(value: str) -> str:
    if len(value) > 253 or not _SECTION_NAME.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a listener name: lower-case DNS labels separated by dots"
        )
    return value


SectionName = Annotated[str, Field(min_length=1, max_length=253)]
Kind = Annotated[str, Field(min_length=1, max_length=63, pattern=_KIND.pattern)]
Group = Annotated[str, Field(max_length=253)]


class ParametersReference(StrictModel):
    group: Group
    kind: Kind
    name: Annotated[str, Field(min_length=1, max_length=253)]
    namespace: Namespace | None = None


class GatewayClassSpec(StrictModel):
    controller_name: Annotated[str, Field(min_length=1, max_length=253)] = Field(
        alias="controllerName"
    )
    parameters_ref: ParametersReference | None = Field(default=None, alias="parametersRef")
    description: Annotated[str, Field(max_length=64)] | None = None

    @field_validator("controller_name")
    @classmethod
    def _controller(cls, value: str) -> str:
        if not _CONTROLLER.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a controller name: a domain-prefixed path "
                "(e.g. 'trellis.dev/gateway')"
            )
        return value


class GatewayClass(Resource[GatewayClassSpec]):
    """A class of Gateways and the controller that serves them (cluster-scoped)."""


class TLSBackendRef(BackendObjectReference):
    weight: Weight = 1


class SecretObjectReference(StrictModel):
    group: Group = ""
    kind: Kind = "Secret"
    name: ObjectName
    namespace: Namespace | None = None

    @property
    def is_secret(self) -> bool:
        return self.group in ("", "core") and self.kind == "Secret"


class ListenerTLSConfig(StrictModel):
    mode: Literal["Terminate", "Passthrough"] = "Terminate"
    certificate_refs: tuple[SecretObjectReference, ...] = Field(
        default=(), alias="certificateRefs", max_length=64
    )
    options: dict[str, str] = Field(default_factory=dict, max_length=16)


class LabelSelectorRequirement(StrictModel):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()


class LabelSelector(StrictModel):
    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(
        default=(), alias="matchExpressions"
    )

    def matches(self, labels: dict[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        for requirement in self.match_expressions:
            present = requirement.key in labels
            value = labels.get(requirement.key)
            if requirement.operator == "In" and value not in requirement.values:
                return False
            if requirement.operator == "NotIn" and present and value in requirement.values:
                return False
            if requirement.operator == "Exists" and not present:
                return False
            if requirement.operator == "DoesNotExist" and present:
                return False
        return True


class RouteNamespaces(StrictModel):
    from_: Literal["All", "Same", "Selector"] = Field(default="Same", alias="from")
    selector: LabelSelector | None = None

    @model_validator(mode="after")
    def _selector(self) -> RouteNamespaces:
        if self.from_ == "Selector" and self.selector is None:
            _invalid(("selector",), "is required when 'from' is Selector", None)
        return self


class RouteGroupKind(StrictModel):
    group: Group = GROUP
    kind: Kind


class AllowedRoutes(StrictModel):
    namespaces: RouteNamespaces = RouteNamespaces()
    kinds: tuple[RouteGroupKind, ...] = Field(default=(), max_length=8)


class Listener(StrictModel):
    name: SectionName
    hostname: Hostname | None = None
    port: Port
    protocol: Annotated[str, Field(min_length=1, max_length=255)]
    tls: ListenerTLSConfig | None = None
    allowed_routes: AllowedRoutes = Field(default=AllowedRoutes(), alias="allowedRoutes")

    _name = field_validator("name")(lambda cls, v: _section_name(v))
    _host = field_validator("hostname")(lambda cls, v: _hostname(v) if v is not None else v)

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, value: str) -> str:
        if not _PROTOCOL.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a protocol: a core name (HTTP, HTTPS, TLS, TCP, UDP) or a "
                "domain-prefixed one (example.com/name)"
            )
        return value


class GatewayAddress(StrictModel):
    type: str = "IPAddress"
    value: Annotated[str, Field(max_length=253)] = ""


class GatewaySpec(StrictModel):
    gateway_class_name: ObjectName = Field(alias="gatewayClassName")
    listeners: tuple[Listener, ...] = Field(min_length=1, max_length=64)
    addresses: tuple[GatewayAddress, ...] = Field(default=(), max_length=16)
    # read, not acted on: the status says so
    infrastructure: dict[str, Any] | None = None
    allowed_listeners: dict[str, Any] | None = Field(default=None, alias="allowedListeners")
    tls: dict[str, Any] | None = None
    default_scope: str | None = Field(default=None, alias="defaultScope")

    def not_applied(self) -> tuple[str, ...]:
        """The fields set that Trellis reads but does not act on (for the status)."""
        fields = {
            "spec.tls": self.tls,
            "spec.allowedListeners": self.allowed_listeners,
            "spec.defaultScope": self.default_scope,
        }
        return tuple(name for name, value in fields.items() if value)

    @model_validator(mode="after")
    def _listeners(self) -> GatewaySpec:
        names: set[str] = set()
        triples: set[tuple[int, str, str | None]] = set()
        for index, listener in enumerate(self.listeners):
            where: tuple[str | int, ...] = ("listeners", index)
            if listener.name in names:
                _invalid((*where, "name"), "Listener name must be unique within the Gateway", None)
            names.add(listener.name)
            triple = (listener.port, listener.protocol, listener.hostname)
            if triple in triples:
                _invalid(
                    where,
                    "Combination of port, protocol and hostname must be unique for each listener",
                    None,
                )
            triples.add(triple)
            protocol, tls = listener.protocol, listener.tls
            if protocol in ("HTTP", "TCP", "UDP") and tls is not None:
                _invalid((*where, "tls"), f"tls must not be specified for {protocol}", None)
            if protocol == "HTTPS" and tls is not None and tls.mode != "Terminate":
                _invalid((*where, "tls", "mode"), "tls mode must be Terminate for HTTPS", None)
            if protocol == "TLS" and tls is None:
                _invalid((*where, "tls"), "tls mode must be set for protocol TLS", None)
            if protocol in ("TCP", "UDP") and listener.hostname:
                _invalid(
                    (*where, "hostname"), f"hostname must not be specified for {protocol}", None
                )
            if (
                tls is not None
                and tls.mode == "Terminate"
                and not tls.certificate_refs
                and not tls.options
            ):
                _invalid(
                    (*where, "tls"),
                    "certificateRefs or options must be specified when mode is Terminate",
                    None,
                )
        return self


class Gateway(Resource[GatewaySpec]):
    """A Gateway: listeners (port, protocol, hostname, TLS) that routes attach to."""


class TLSRouteRule(StrictModel):
    name: SectionName | None = None
    backend_refs: tuple[TLSBackendRef, ...] = Field(
        alias="backendRefs", min_length=1, max_length=16
    )


class TLSRouteSpec(StrictModel):
    parent_refs: tuple[ParentReference, ...] = Field(default=(), alias="parentRefs", max_length=32)
    hostnames: tuple[Hostname, ...] = Field(min_length=1, max_length=1024)
    rules: tuple[TLSRouteRule, ...] = Field(min_length=1, max_length=1)

    _hosts = field_validator("hostnames")(lambda cls, values: tuple(_hostname(v) for v in values))


class TLSRoute(Resource[TLSRouteSpec]):
    """A TLSRoute: TLS connections to a Gateway's TLS listener (``Passthrough``), chosen by
    their server name (SNI) and passed, still encrypted, to weighted backends."""


class ReferenceGrantFrom(StrictModel):
    group: Group
    kind: Kind
    namespace: Namespace


class ReferenceGrantTo(StrictModel):
    group: Group
    kind: Kind
    name: ObjectName | None = None


class ReferenceGrantSpec(StrictModel):
    from_: tuple[ReferenceGrantFrom, ...] = Field(alias="from", min_length=1, max_length=16)
    to: tuple[ReferenceGrantTo, ...] = Field(min_length=1, max_length=16)


class ReferenceGrant(Resource[ReferenceGrantSpec]):
    """Lets objects of some kinds in other namespaces refer to objects in its namespace."""


def register(registry: KindRegistry) -> None:
    registry.register("GatewayClass", GATEWAY_CLASS_API_VERSIONS, GatewayClass)
    registry.register("Gateway", GATEWAY_API_VERSIONS, Gateway)
    registry.register("ReferenceGrant", REFERENCE_GRANT_API_VERSIONS, ReferenceGrant)
    registry.register("TLSRoute", TLS_ROUTE_API_VERSIONS, TLSRoute)
