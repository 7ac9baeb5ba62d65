"""Prometheus metrics of endpoints-vm, on the registry the service passes in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass(frozen=True)
class EndpointMetrics:
    workloads: Gauge
    services: Gauge
    endpoints: Gauge
    registrations: Counter
    expirations: Counter
    changes: Counter
    document_errors: Gauge
    store_pending: Gauge
    store_available: Gauge
    store_refusals: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> EndpointMetrics:
        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"trellis_endpoints_vm_{name}", doc, labels, registry=registry)

        return cls(
            workloads=gauge("workloads", "Registered workloads", ("state",)),
            services=gauge("services", "Services known to this provider"),
            endpoints=gauge("endpoints", "Endpoints across all services"),
            registrations=Counter(
                "trellis_endpoints_vm_registrations", "Registrations received", registry=registry
            ),
            expirations=Counter(
                "trellis_endpoints_vm_expirations",
                "Workloads taken out after missing heartbeats",
                registry=registry,
            ),
            changes=Counter(
                "trellis_endpoints_vm_service_changes",
                "Service views changed (each one signalled on the topic endpoints)",
                registry=registry,
            ),
            document_errors=gauge("document_errors", "Invalid documents in the spec directory"),
            store_pending=gauge(
                "store_pending_writes", "Workload writes queued while Redis is unavailable"
            ),
            store_available=gauge(
                "store_available", "1 while Redis takes the workload store's writes, else 0"
            ),
            store_refusals=Counter(
                "trellis_endpoints_vm_store_refusals",
                "Registrations and deregistrations refused (503) because Redis was unavailable",
                ["operation"],
                registry=registry,
            ),
        )
