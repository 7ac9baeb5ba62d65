"""Prometheus metrics of endpoints-vm, on the registry the service passes in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from trellis_common.metrics import MetricFactory


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
        make = MetricFactory(registry, "trellis_endpoints_vm")
        return cls(
            workloads=make.gauge("workloads", "Registered workloads", "state"),
            services=make.gauge("services", "Services known to this provider"),
            endpoints=make.gauge("endpoints", "Endpoints across all services"),
            registrations=make.counter("registrations", "Registrations received"),
            expirations=make.counter("expirations", "Workloads taken out after missing heartbeats"),
            changes=make.counter(
                "service_changes",
                "Service views changed (each one signalled on the topic endpoints)",
            ),
            document_errors=make.gauge(
                "document_errors", "Invalid documents in the spec directory"
            ),
            store_pending=make.gauge(
                "store_pending_writes", "Workload writes queued while Redis is unavailable"
            ),
            store_available=make.gauge(
                "store_available", "1 while Redis takes the workload store's writes, else 0"
            ),
            store_refusals=make.counter(
                "store_refusals",
                "Registrations and deregistrations refused (503) because Redis was unavailable",
                "operation",
            ),
        )
