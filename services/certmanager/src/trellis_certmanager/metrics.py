"""Prometheus metrics of certmanager, registered on the registry the service passes in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class CertMetrics:
    issued: Counter
    rotations: Counter
    certificates: Gauge
    root_not_after: Gauge
    issue_seconds: Histogram

    @classmethod
    def create(cls, registry: CollectorRegistry) -> CertMetrics:
        return cls(
            issued=Counter(
                "trellis_certmanager_certificates_issued",
                "Certificates issued (new subjects and re-issues)",
                ["kind"],
                registry=registry,
            ),
            rotations=Counter(
                "trellis_certmanager_rotations",
                "Certificates rotated",
                ["kind", "reason"],
                registry=registry,
            ),
            certificates=Gauge(
                "trellis_certmanager_certificates",
                "Certificates on record",
                ["kind"],
                registry=registry,
            ),
            root_not_after=Gauge(
                "trellis_certmanager_root_not_after_seconds",
                "Expiry of the mesh root certificate (unix time)",
                registry=registry,
            ),
            issue_seconds=Histogram(
                "trellis_certmanager_issue_seconds",
                "Time to generate a key and sign a certificate",
                ["kind"],
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                registry=registry,
            ),
        )
