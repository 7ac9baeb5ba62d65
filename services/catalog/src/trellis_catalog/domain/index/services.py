"""Known services: declared Kubernetes Services merged with what providers report.

A provider knows a service's endpoints (and, for a ServiceEntry, its hosts, ports and
resolution); a declared ``Service`` knows its ports, target ports and protocols. The index
merges them per ``namespace/name``; clusters (one per service port) then take each
endpoint's port by name, as users expect from Kubernetes and as ARCHITECTURE.md states for
VMs: ``targetPort`` naming a port, else the port's own name, else a bare number serves the
Service's only port.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import chain, repeat

from trellis_catalog.domain.model.views import ClusterEndpoint, ClusterRef, ClusterState
from trellis_common.documents import core
from trellis_common.memo import Members, sorted_unique
from trellis_common.model import MeshService, ReportedEndpoint, ServiceReach

_PROTOCOLS = {"HTTP": "http", "HTTP2": "http2", "GRPC": "grpc"}  # the rest is TCP to a proxy
_SENT_AS = frozenset({"TLS", "HTTPS", "MONGO"})
_DISCOVERY = {
    "STATIC": "STATIC",
    "DNS": "DNS",
    "DNS_ROUND_ROBIN": "LOGICAL_DNS",  # the first answer, per connection (Envoy's logical DNS)
    "NONE": "PASSTHROUGH",
}


@dataclass(frozen=True, slots=True)
class ProvidedEndpoint(ReportedEndpoint):
    """An endpoint as a provider reported it, and which provider did."""

    provider: str = ""


@dataclass(frozen=True, slots=True)
class ProvidedService(ServiceReach):
    """One provider's report of one service (endpoints-vm, endpoints-k8s, ...)."""

    provider: str
    namespace: str
    name: str
    ports: tuple[tuple[str, int, str, int], ...]  # name, number, protocol, target port
    endpoints: tuple[ProvidedEndpoint, ...]
    source: str = ""
    key: str = ""  # the provider's own name for it, when not ``name`` (a ServiceEntry host)

    @property
    def service(self) -> MeshService:
        return MeshService(self.namespace, self.name)

    @property
    def provider_key(self) -> str:
        return self.key or self.name


def merge_reports(reports: list[ProvidedService]) -> ProvidedService:
    """One provider's reports of one service under several keys (a ServiceEntry's hosts):
    one report with every host and every endpoint."""
    if len(reports) == 1:
        return reports[0]
    ordered = sorted(reports, key=lambda r: r.provider_key)
    first = ordered[0]
    hosts = tuple(sorted({h for r in ordered for h in r.hosts}))
    endpoints = tuple(dict.fromkeys(e for r in ordered for e in r.endpoints))
    return replace(first, key="", hosts=hosts, endpoints=endpoints)


@dataclass(frozen=True, slots=True)
class PortSpec:
    port: int
    target: int | str
    name: str
    protocol: str  # http, http2, grpc, tcp
    declared: bool = True  # False: HTTP by default (no appProtocol, no protocol name)
    # A ServiceEntry's TLS, HTTPS or MONGO port (lower case): TCP to the mesh, but a sidecar
    # matches TLS by SNI and puts Mongo's filter in front, so the view keeps the name.
    sent_as: str = ""


@dataclass(frozen=True, slots=True)
class KnownService:
    service: MeshService
    ports: tuple[PortSpec, ...]
    location: str
    discovery: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    export_to: tuple[str, ...]
    subject_alt_names: tuple[str, ...]
    declared: bool
    providers: tuple[str, ...]
    endpoints: tuple[ProvidedEndpoint, ...]

    @property
    def external(self) -> bool:
        return self.location == "MESH_EXTERNAL"

    def exported_to(self, namespace: str) -> bool:
        if not self.export_to:
            return True
        return any(
            target in ("*", namespace) or (target == "." and namespace == self.service.namespace)
            for target in self.export_to
        )

    def cluster_name(self, port: int) -> str:
        return f"{self.service.namespace}/{self.service.name}|{port}"

    def cluster_ref(self, port: PortSpec) -> ClusterRef:
        """The cluster for one of this service's ports, as views and policies name it."""
        return ClusterRef(
            name=self.cluster_name(port.port),
            namespace=self.service.namespace,
            service=self.service.name,
            port=port.port,
            protocol=port.protocol,
            discovery=self.discovery,
            mesh_tls=not self.external,
            subject_alt_names=self.subject_alt_names,
        )


def _declared_ports(service: core.Service) -> tuple[PortSpec, ...]:
    return tuple(
        PortSpec(p.port, p.target, p.name or "", p.resolved_protocol(), p.protocol_is_declared())
        for p in service.spec.ports
        if p.protocol == "TCP"
    )


def _provided_ports(reports: list[ProvidedService]) -> tuple[PortSpec, ...]:
    found: dict[int, PortSpec] = {}
    for report in reports:
        for name, number, protocol, target in report.ports:
            proto = _PROTOCOLS.get(protocol.upper(), "tcp" if protocol else "http")
            declared = bool(protocol)
            if not protocol and name:
                port = core.ServicePort(name=name, port=number)
                proto, declared = port.resolved_protocol(), port.protocol_is_declared()
            sent_as = protocol.lower() if protocol.upper() in _SENT_AS else ""
            found.setdefault(
                number, PortSpec(number, target or name or number, name, proto, declared, sent_as)
            )
    return tuple(found[n] for n in sorted(found))


def known_service(
    service: MeshService,
    declared: core.Service | None,
    reports: Iterable[ProvidedService],
    route_ports: frozenset[tuple[int, str]] = frozenset(),
) -> KnownService | None:
    """One service from its declaration and its providers' reports (None: nobody knows it).

    ``route_ports`` are the ports routes send to, with their protocol (GRPCRoute: gRPC,
    TLSRoute: TCP), taken unless the port declares one (``appProtocol`` or its name), as
    Gateway API says."""
    found = sorted(reports, key=lambda r: r.provider)
    if declared is None and not found:
        return None
    first = found[0] if found else None
    ports = (_declared_ports(declared) if declared is not None else ()) or _provided_ports(found)
    if route_ports:
        protocols = dict(sorted(route_ports))  # one protocol per port: "tcp" after "grpc"
        ports = tuple(
            replace(p, protocol=protocols[p.port]) if p.port in protocols and not p.declared else p
            for p in ports
        )
    return KnownService(
        service=service,
        ports=ports,
        location=first.location if first else "MESH_INTERNAL",
        discovery=_DISCOVERY.get(first.resolution, "STATIC") if first else "STATIC",
        hosts=first.hosts if first else (),
        addresses=first.addresses if first else (),
        export_to=first.export_to if first else (),
        subject_alt_names=first.subject_alt_names if first else (),
        declared=declared is not None,
        providers=tuple(r.provider for r in found),
        endpoints=tuple(chain.from_iterable(map(_as_provided, found))),
    )


def _as_provided(report: ProvidedService) -> tuple[ProvidedEndpoint, ...]:
    """``report``'s endpoints, each marked with its provider (as they mostly are already)."""
    endpoints, provider = report.endpoints, report.provider
    if all(map(operator.eq, map(_PROVIDER, endpoints), repeat(provider))):
        return endpoints
    return tuple(e if e.provider == provider else replace(e, provider=provider) for e in endpoints)


_PROVIDER = operator.attrgetter("provider")
_ACCOUNT = operator.attrgetter("service_account")
_SOMETHING = functools.partial(operator.is_not, None)


def index(
    declared: Mapping[MeshService, core.Service],
    provided: Iterable[ProvidedService],
    route_ports: Mapping[MeshService, frozenset[tuple[int, str]]] | None = None,
) -> dict[MeshService, KnownService]:
    reports: dict[MeshService, list[ProvidedService]] = {}
    for report in provided:
        reports.setdefault(report.service, []).append(report)
    known: dict[MeshService, KnownService] = {}
    routed = route_ports or {}
    for service in sorted(set(declared) | set(reports), key=str):
        entry = known_service(
            service,
            declared.get(service),
            reports.get(service, []),
            routed.get(service, frozenset()),
        )
        if entry is not None:
            known[service] = entry
    return known


def endpoint_port(endpoint: ProvidedEndpoint, port: PortSpec, single_port: bool) -> int | None:
    """The port ``endpoint`` serves ``port`` on, or None if it does not serve it."""
    ports = dict(endpoint.ports)
    if isinstance(port.target, str):
        return ports.get(port.target)
    if port.name and port.name in ports:
        return ports[port.name]
    if "" in ports:
        # a workload registered with a bare number serves the Service's only port
        return ports[""] if single_port else None
    return port.target if not ports else None


def spiffe_id(trust_domain: str, namespace: str, account: str) -> str:
    return f"spiffe://{trust_domain}/ns/{namespace}/sa/{account}"


def cluster_endpoint(
    endpoint: ProvidedEndpoint, serving: tuple[PortSpec, bool]
) -> ClusterEndpoint | None:
    """``endpoint`` in the cluster of ``serving`` (a port, and whether it is the service's
    only one), or None if it does not serve that port."""
    port, single = serving
    number = endpoint_port(endpoint, port, single)
    if number is None:
        return None
    return ClusterEndpoint(
        address=endpoint.address,
        port=number,
        weight=endpoint.weight or 1,
        locality=endpoint.locality,
        service_account=endpoint.service_account,
        provider=endpoint.provider,
        labels=endpoint.labels,
        workload=endpoint.workload,
    )


#: Cluster endpoints by cluster name, kept while the provided endpoint is the same object
#: (:class:`~trellis_common.memo.Members`): one endpoint of 200 moved converts one.
ClusterEndpoints = Members[str, ProvidedEndpoint, ClusterEndpoint | None]


def cluster(
    known: KnownService,
    port: PortSpec,
    trust_domain: str,
    version: str = "",
    memo: ClusterEndpoints | None = None,
) -> ClusterState:
    ref = known.cluster_ref(port)
    serving = (port, len(known.ports) == 1)
    found = (
        memo.convert(ref.name, known.endpoints, serving)
        if memo is not None
        else [cluster_endpoint(e, serving) for e in known.endpoints]
    )
    # None: the endpoint does not serve the port
    endpoints: list[ClusterEndpoint] = list(filter(_SOMETHING, found))  # type: ignore[arg-type]
    accounts = set(filter(None, map(_ACCOUNT, endpoints)))
    namespace = known.service.namespace
    spiffe = (
        ()
        if known.external
        else tuple(sorted(spiffe_id(trust_domain, namespace, a) for a in accounts))
    )
    return ClusterState(ref, sorted_unique(endpoints), spiffe, version)
