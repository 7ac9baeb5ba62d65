"""OSM's policy API for traffic that crosses the mesh's edge: ``Egress`` and
``IngressBackend`` (``policy.openservicemesh.io/v1alpha1``).

Fields, requirements and meanings are OSM v1.2's (``pkg/apis/policy/v1alpha1``, the CRDs
``egresses`` and ``ingressbackends``, ``pkg/catalog/egress.go`` and ``ingress.go``):

- an **Egress** lets the workloads of some service accounts (``spec.sources``, kind
  ``ServiceAccount``) reach hosts outside the mesh on some ports. A port's ``protocol`` is
  ``http`` (the request's Host is matched against ``spec.hosts``, and its path, method and
  headers against the HTTPRouteGroups in ``spec.matches``), ``https`` (the TLS server name
  against ``spec.hosts``, or any host when there are none), or ``tcp`` /
  ``tcp-server-first`` (the destination address against ``spec.ipAddresses``, IPv4 CIDRs;
  hosts do not apply). OSM lower-cases the protocol, and so does Trellis. ``spec.matches``
  may also name an UpstreamTrafficSetting of the Egress' namespace, whose
  ``connectionSettings`` then apply to these hosts. An Egress only applies while MeshConfig
  ``traffic.enableEgress`` is off (with it on, everything may leave);
- an **IngressBackend** admits traffic from outside the mesh to some of its namespace's
  services (``spec.backends``: a service name and its *target* port, as OSM matches it):
  ``http`` in plaintext from the addresses of ``spec.sources`` (kind ``Service``: its
  endpoints' addresses; ``IPRange``: a CIDR), ``https`` over mTLS from a client whose
  certificate names one of the ``AuthenticatedPrincipal`` sources.
"""

from __future__ import annotations

import ipaddress
from typing import Final, Literal

from pydantic import Field, field_validator, model_validator

from trellis_common import model
from trellis_common.documents.base import KindRegistry, Resource, StrictModel
from trellis_common.documents.osm import POLICY_API_VERSIONS
from trellis_common.documents.smi import (
    SPECS_API_VERSIONS,
    Namespace,
    ObjectName,
    Port,
    _invalid,
)

#: The protocols OSM applies to an Egress port (``pkg/catalog/egress.go``).
EGRESS_PROTOCOLS: Final = ("http", "https", "tcp", "tcp-server-first")
#: The protocols of an IngressBackend's backend port.
INGRESS_PROTOCOLS: Final = ("http", "https")


def _cidr(value: str) -> ipaddress.IPv4Network:
    """An IPv4 CIDR as OSM's CRD and ``net.ParseCIDR`` take it (host bits may be set)."""
    if "/" not in value:
        raise ValueError(f"must be an IPv4 CIDR such as '10.0.0.0/8', got {value!r}")
    try:
        return ipaddress.IPv4Network(value, strict=False)
    except ValueError:
        raise ValueError(f"must be an IPv4 CIDR such as '10.0.0.0/8', got {value!r}") from None


def _host(value: str) -> str:
    """A host name (or ``*.<domain>``) or IPv4 address, as a client names it: no scheme,
    port or path."""
    text = value.strip().lower().rstrip(".")
    if not text or any(c in text for c in "/:@ ") or text.count("*") > (text[:2] == "*."):
        raise ValueError(
            f"must be a host name such as 'httpbin.org' or '*.example.com' (no scheme, port "
            f"or path), got {value!r}"
        )
    return text


class SourceAccount(StrictModel):
    kind: Literal["ServiceAccount"]
    name: ObjectName
    namespace: Namespace


def _known_protocol(value: str, known: tuple[str, ...]) -> str:
    """A port's protocol, lower-cased as OSM compares it; one OSM would skip is an error."""
    lower = value.lower()
    if lower not in known:
        raise ValueError(f"must be one of {', '.join(known)} (OSM applies no other), got {value!r}")
    return lower


class EgressPort(StrictModel):
    number: Port
    protocol: str

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, value: str) -> str:
        return _known_protocol(value, EGRESS_PROTOCOLS)


class TypedReference(StrictModel):
    """A ``TypedLocalObjectReference``: an object of the policy's own namespace."""

    api_group: str = Field(alias="apiGroup")
    kind: str = Field(min_length=1)
    name: ObjectName

    @property
    def route_group(self) -> bool:
        return self.kind == "HTTPRouteGroup" and self.api_group in SPECS_API_VERSIONS

    @property
    def traffic_setting(self) -> bool:
        return self.kind == "UpstreamTrafficSetting" and self.api_group in POLICY_API_VERSIONS


class EgressSpec(StrictModel):
    sources: tuple[SourceAccount, ...]
    hosts: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = Field(default=(), alias="ipAddresses")
    ports: tuple[EgressPort, ...]
    matches: tuple[TypedReference, ...] = ()

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        found = []
        for index, host in enumerate(value):
            try:
                found.append(_host(host))
            except ValueError as exc:
                _invalid((index,), str(exc), host)
        return tuple(dict.fromkeys(found))

    @field_validator("ip_addresses")
    @classmethod
    def _ip_addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        found = []
        for index, text in enumerate(value):
            try:
                found.append(str(_cidr(text)))
            except ValueError as exc:
                _invalid((index,), str(exc), text)
        return tuple(dict.fromkeys(found))

    @model_validator(mode="after")
    def _required(self) -> EgressSpec:
        if not self.sources:
            _invalid(("sources",), "must name at least one ServiceAccount", [])
        if not self.ports:
            _invalid(("ports",), "must list at least one port", [])
        for index, port in enumerate(self.ports):
            if port.protocol == "http" and not self.hosts:
                _invalid(
                    ("ports", index, "protocol"),
                    "http egress matches the request's host: spec.hosts must name at least one",
                    port.protocol,
                )
        return self


class Egress(Resource[EgressSpec]):
    """Calls from some service accounts to hosts outside the mesh."""

    def source_accounts(self) -> tuple[model.ServiceAccount, ...]:
        return tuple(model.ServiceAccount(s.namespace, s.name) for s in self.spec.sources)

    def route_groups(self) -> tuple[str, ...]:
        """The HTTPRouteGroups (of this namespace) whose matches narrow the http ports."""
        return tuple(m.name for m in self.spec.matches if m.route_group)

    def traffic_setting(self) -> str | None:
        """The UpstreamTrafficSetting (of this namespace) whose connectionSettings apply."""
        return next((m.name for m in self.spec.matches if m.traffic_setting), None)

    def ignored(self) -> tuple[str, ...]:
        """What OSM ignores with an error log, for the status."""
        return tuple(
            f"spec.matches[{index}]: {m.api_group} {m.kind} is not an HTTPRouteGroup "
            f"({SPECS_API_VERSIONS[-1]}) or an UpstreamTrafficSetting "
            f"({POLICY_API_VERSIONS[0]}); ignored, as OSM does"
            for index, m in enumerate(self.spec.matches)
            if not (m.route_group or m.traffic_setting)
        )


class BackendPort(StrictModel):
    number: Port
    protocol: str

    @field_validator("protocol")
    @classmethod
    def _protocol(cls, value: str) -> str:
        return _known_protocol(value, INGRESS_PROTOCOLS)


class BackendTLS(StrictModel):
    skip_client_cert_validation: bool = Field(alias="skipClientCertValidation")
    sni_hosts: tuple[str, ...] = Field(default=(), alias="sniHosts")


class Backend(StrictModel):
    name: ObjectName
    port: BackendPort
    tls: BackendTLS | None = None


class IngressSource(StrictModel):
    kind: Literal["Service", "AuthenticatedPrincipal", "IPRange"]
    name: str = Field(min_length=1)
    namespace: Namespace | None = None

    @model_validator(mode="after")
    def _by_kind(self) -> IngressSource:
        if self.kind == "Service" and self.namespace is None:
            _invalid(("namespace",), "is required for a source of kind Service", None)
        if self.kind == "IPRange":
            try:
                _cidr(self.name)
            except ValueError as exc:
                _invalid(("name",), str(exc), self.name)
        return self


class IngressBackendSpec(StrictModel):
    backends: tuple[Backend, ...]
    sources: tuple[IngressSource, ...]
    matches: tuple[TypedReference, ...] = ()

    @model_validator(mode="after")
    def _required(self) -> IngressBackendSpec:
        if not self.backends:
            _invalid(("backends",), "must name at least one backend", [])
        if not self.sources:
            _invalid(("sources",), "must name at least one source", [])
        return self


class IngressBackend(Resource[IngressBackendSpec]):
    """Traffic from outside the mesh (an ingress controller) admitted to some services."""

    def source_ranges(self) -> tuple[str, ...]:
        """The IPRange sources, as normalised CIDRs."""
        return tuple(str(_cidr(s.name)) for s in self.spec.sources if s.kind == "IPRange")

    def source_services(self) -> tuple[model.MeshService, ...]:
        return tuple(
            model.MeshService(s.namespace, s.name)
            for s in self.spec.sources
            if s.kind == "Service" and s.namespace is not None
        )

    def principals(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.spec.sources if s.kind == "AuthenticatedPrincipal")

    def not_applied(self) -> tuple[str, ...]:
        """What Trellis reads but does not apply, for the status."""
        return tuple(f"spec.matches[{index}]" for index in range(len(self.spec.matches)))


def register(registry: KindRegistry) -> None:
    registry.register("Egress", POLICY_API_VERSIONS, Egress)
    registry.register("IngressBackend", POLICY_API_VERSIONS, IngressBackend)
