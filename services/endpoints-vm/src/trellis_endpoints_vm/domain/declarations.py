"""Istio ServiceEntry and WorkloadEntry, as the registry uses them.

The pydantic models of :mod:`trellis_common.documents.istio` are turned into small frozen
values here, once per reload; the registry then resolves each ServiceEntry host to a
service view, the way Istio does:

- ``resolution: NONE``: no endpoints; the proxy passes traffic to the address dialed.
- inline ``endpoints``: each endpoint serves every port of the entry, on the port its
  ``ports`` map names, else the entry port's ``targetPort``, else its number.
- ``workloadSelector``: the WorkloadEntries (and registered workloads) of the entry's
  namespace whose labels include the selector's.
- ``DNS``/``DNS_ROUND_ROBIN`` without endpoints: each non-wildcard host is its own
  endpoint, kept as a hostname for the proxy to resolve.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trellis_common.documents import istio
from trellis_common.documents.base import Document
from trellis_endpoints_vm.domain.views import (
    EndpointInfo,
    Pairs,
    PortInfo,
    PortMap,
    ServiceInfo,
    ServiceKey,
)


@dataclass(frozen=True, slots=True)
class DeclaredEndpoint:
    address: str
    ports: Mapping[str, int]
    labels: Pairs = ()
    locality: str = ""
    network: str = ""
    weight: int = 1
    service_account: str = ""
    workload: str = ""
    source: str = ""

    def serving(self, ports: Iterable[PortInfo], source: str) -> EndpointInfo:
        return EndpointInfo(
            address=self.address,
            ports=port_map(ports, self.ports),
            labels=self.labels,
            locality=self.locality,
            network=self.network,
            weight=self.weight,
            service_account=self.service_account,
            workload=self.workload,
            source=self.source or source,
        )


@dataclass(frozen=True, slots=True)
class DeclaredEntry:
    """One ServiceEntry, resolved per host by the registry."""

    namespace: str
    name: str
    hosts: tuple[str, ...]
    addresses: tuple[str, ...]
    ports: tuple[PortInfo, ...]
    location: str
    resolution: str
    endpoints: tuple[DeclaredEndpoint, ...]
    selector: Pairs | None
    export_to: tuple[str, ...]
    subject_alt_names: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def source(self) -> str:
        return f"ServiceEntry {self.id}"

    def service_keys(self) -> list[ServiceKey]:
        return [ServiceKey(self.namespace, host) for host in self.hosts]

    def info(self, host: str) -> ServiceInfo:
        return ServiceInfo(
            key=ServiceKey(self.namespace, host),
            ports=self.ports,
            hosts=(host,),
            addresses=self.addresses,
            location=self.location,
            resolution=self.resolution,
            export_to=self.export_to,
            subject_alt_names=self.subject_alt_names,
            source=self.source,
        )

    def selects(self, labels: Mapping[str, str]) -> bool:
        return self.selector is not None and all(labels.get(k) == v for k, v in self.selector)

    def resolve(self, host: str, selected: Iterable[DeclaredEndpoint]) -> tuple[EndpointInfo, ...]:
        """The endpoints of ``host``; ``selected`` are what the workload selector matched."""
        if self.resolution == "NONE":
            return ()
        if self.selector is not None:
            found = [e.serving(self.ports, self.source) for e in selected]
        elif self.endpoints:
            found = [e.serving(self.ports, self.source) for e in self.endpoints]
        elif self.resolution.startswith("DNS") and not host.startswith("*"):
            found = [DeclaredEndpoint(host, {}).serving(self.ports, self.source)]
        else:
            found = []
        return tuple(sorted(set(found)))


def port_map(ports: Iterable[PortInfo], overrides: Mapping[str, int]) -> PortMap:
    """Each service port's number on one endpoint: named override, else target, else same."""
    return tuple(
        sorted((p.name, overrides.get(p.name) or p.target_port or p.number) for p in ports)
    )


def _declared_endpoint(
    spec: istio.WorkloadEntrySpec, workload: str, source: str
) -> DeclaredEndpoint:
    return DeclaredEndpoint(
        address=spec.address,
        ports=dict(spec.ports),
        labels=tuple(sorted(spec.labels.items())),
        locality=spec.locality,
        network=spec.network,
        weight=spec.weight or 1,  # 0 means "not set" in Istio: an equal share
        service_account=spec.service_account,
        workload=workload,
        source=source,
    )


def from_documents(
    documents: Iterable[Document],
) -> tuple[list[DeclaredEntry], list[DeclaredEndpoint]]:
    """The ServiceEntries and WorkloadEntries among ``documents``, as the registry wants them."""
    entries: list[DeclaredEntry] = []
    workload_entries: list[DeclaredEndpoint] = []
    for document in documents:
        resource = document.resource
        key = document.key
        if isinstance(resource, istio.WorkloadEntry):
            workload = f"{key.namespace}/{key.name}"
            workload_entries.append(
                _declared_endpoint(resource.spec, workload, f"WorkloadEntry {workload}")
            )
        elif isinstance(resource, istio.ServiceEntry):
            spec = resource.spec
            source = f"ServiceEntry {key.namespace}/{key.name}"
            entries.append(
                DeclaredEntry(
                    namespace=key.namespace,
                    name=key.name,
                    hosts=tuple(spec.hosts),
                    addresses=tuple(spec.addresses),
                    ports=tuple(
                        PortInfo(p.name, p.number, str(p.protocol or ""), p.target_port or 0)
                        for p in spec.ports
                    ),
                    location=str(spec.location),
                    resolution=str(spec.resolution),
                    endpoints=tuple(_declared_endpoint(e, "", source) for e in spec.endpoints),
                    selector=(
                        tuple(sorted(spec.workload_selector.labels.items()))
                        if spec.workload_selector is not None
                        else None
                    ),
                    export_to=tuple(spec.export_to),
                    subject_alt_names=tuple(spec.subject_alt_names),
                )
            )
    return entries, workload_entries
