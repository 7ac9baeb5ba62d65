"""Prometheus metrics of certmanager, registered on the registry the service passes in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from trellis_common.metrics import MetricFactory


class CertMetrics:
    """Made once per service, on the registry it passes in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        make = MetricFactory(registry, "trellis_certmanager")
        self.issued = make.counter(
            "certificates_issued", "Certificates issued (new subjects and re-issues)", "kind"
        )
        self.rotations = make.counter("rotations", "Certificates rotated", "kind", "reason")
        self.revocations = make.counter(
            "revocations", "Proxy certificate serials revoked", "reason"
        )
        self.revoked = make.gauge("revoked", "Revoked serials remembered (until they expire)")
        self.certificates = make.gauge("certificates", "Certificates on record", "kind")
        self.root_not_after = make.gauge(
            "root_not_after_seconds", "Expiry of the mesh root certificate (unix time)"
        )
        self.issue_refused = make.counter(
            "issue_refused", "Certificate requests refused, by kind and reason", "kind", "reason"
        )
        self.ca_refused = make.counter(
            "ca_refused", "CAs found in the store and refused (never adopted)", "reason"
        )
        self.issue_seconds = make.histogram(
            "issue_seconds",
            "Time to generate a key and sign a certificate",
            "kind",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
