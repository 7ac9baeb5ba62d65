"""Prometheus metrics of certmanager, registered on the registry the service passes in."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_runtime.metrics import MetricFactory


class EarliestExpiry(Collector):
    """``trellis_certmanager_earliest_certificate_expiration_timestamp_seconds{kind}``: when
    the first certificate of each kind on record expires, read at scrape time (one series
    per kind, whatever the number of proxies: alert when it comes near)."""

    def __init__(self, records: Callable[[], Iterable[CertificateRecord]]) -> None:
        self._records = records

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "trellis_certmanager_earliest_certificate_expiration_timestamp_seconds",
            "When the first certificate of each kind on record expires (unix time)",
            labels=["kind"],
        )
        earliest: dict[CertificateKind, float] = {}
        for record in self._records():
            moment = record.not_after.timestamp()
            earliest[record.kind] = min(moment, earliest.get(record.kind, moment))
        for kind, moment in sorted(earliest.items(), key=lambda item: item[0].value):
            family.add_metric([kind.value], moment)
        yield family


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
            "root_expiration_timestamp_seconds", "Expiry of the mesh root certificate (unix time)"
        )
        self.issue_refused = make.counter(
            "issue_refused", "Certificate requests refused, by kind and reason", "kind", "reason"
        )
        self.ca_refused = make.counter(
            "ca_refused", "CAs found in the store and refused (never adopted)", "reason"
        )
        self.replica_refused = make.counter(
            "replica_refused",
            "Changes refused between certmanager replicas: a common name held too long by "
            "another (busy), a claim lost, a deposed rotation leader's write",
            "reason",
        )
        self.issue_seconds = make.histogram(
            "issue_seconds",
            "Time to generate a key and sign a certificate",
            "kind",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
        )
