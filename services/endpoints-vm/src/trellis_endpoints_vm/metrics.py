"""Prometheus metrics of endpoints-vm, on the registry the service passes in."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry

from trellis_endpoints_vm.domain.registry import EndpointRegistry
from trellis_endpoints_vm.keeper import StoreKeeper
from trellis_runtime.metrics import MetricFactory


class EndpointMetrics:
    """Made once per service, on the registry it passes in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        make = MetricFactory(registry, "trellis_endpoints_vm")
        self.workloads = make.gauge("workloads", "Registered workloads", "state")
        self.services = make.gauge("services", "Services known to this provider")
        self.endpoints = make.gauge("endpoints", "Endpoints across all services")
        self.registrations = make.counter("registrations", "Registrations received")
        self.expirations = make.counter(
            "expirations", "Workloads taken out after missing heartbeats"
        )
        self.reaped = make.counter(
            "reaped",
            "Workloads deregistered by the leader after staying expired for reap_after",
        )
        self.changes = make.counter(
            "service_changes",
            "Service views changed (each one pushed to the catalog's watches)",
        )
        self.document_errors = make.gauge(
            "document_errors", "Invalid documents in the spec directory"
        )
        self.store_pending = make.gauge(
            "store_pending_writes", "Workload writes queued while Redis is unavailable"
        )
        self.store_available = make.gauge(
            "store_available", "1 while Redis takes the workload store's writes, else 0"
        )
        self.credential_refusals = make.counter(
            "credential_refusals",
            "Registrations, heartbeats and deregistrations refused for their credential, by "
            "operation and reason",
            "operation",
            "reason",
        )
        self.replicas = make.gauge(
            "replicas_known", "Other replicas of endpoints-vm this one signals its changes to"
        )
        self.signals_skipped = make.counter(
            "replica_signals_skipped",
            "Changes not signalled to other replicas: there were none (see replicas_known)",
        )
        self.store_refusals = make.counter(
            "store_refusals",
            "Registrations and deregistrations refused (503) because Redis was unavailable",
            "operation",
        )

    def bind(
        self, registry: EndpointRegistry, keeper: StoreKeeper, clock: Callable[[], float]
    ) -> None:
        """The gauges of ``registry`` and ``keeper``, computed when scraped, so changes pay
        nothing for them."""

        def alive() -> int:
            now = clock()
            return sum(1 for w in registry.workloads.values() if registry.counted(w, now))

        self.workloads.labels("alive").set_function(alive)
        self.workloads.labels("expired").set_function(lambda: len(registry.workloads) - alive())
        self.services.set_function(lambda: len(registry.views))
        self.endpoints.set_function(lambda: sum(len(v.endpoints) for v in registry.views.values()))
        self.store_pending.set_function(lambda: len(keeper.pending))
        self.store_available.set_function(lambda: 1 if keeper.available else 0)
