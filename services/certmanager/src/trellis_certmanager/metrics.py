"""Prometheus metrics of certmanager, registered on the registry the service passes in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from trellis_common.metrics import MetricFactory


@dataclass(frozen=True)
class CertMetrics:
    issued: Counter
    rotations: Counter
    certificates: Gauge
    root_not_after: Gauge
    issue_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> CertMetrics:
        make = MetricFactory(registry, "trellis_certmanager")
        return cls(
            issued=make.counter(
                "certificates_issued", "Certificates issued (new subjects and re-issues)", "kind"
            ),
            rotations=make.counter("rotations", "Certificates rotated", "kind", "reason"),
            certificates=make.gauge("certificates", "Certificates on record", "kind"),
            root_not_after=make.gauge(
                "root_not_after_seconds", "Expiry of the mesh root certificate (unix time)"
            ),
            issue_seconds=make.histogram(
                "issue_seconds",
                "Time to generate a key and sign a certificate",
                "kind",
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            ),
        )
