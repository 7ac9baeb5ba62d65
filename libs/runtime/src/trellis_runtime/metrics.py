"""Declaring one service's Prometheus metrics: its prefix and registry, said once.

Each service keeps its metrics in a frozen dataclass built from the registry it is
passed (no module-level registry). Spelled with ``prometheus_client`` directly, every
declaration repeats the service's prefix and ``registry=registry``, and the metrics
modules of the services grew alike line for line; a :class:`MetricFactory` holds those
two, so a declaration says only what is its own: name, help, labels, buckets.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class MetricFactory:
    """Makes metrics named ``<prefix>_<name>`` on one registry."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.registry = registry
        self.prefix = prefix

    def counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(f"{self.prefix}_{name}", doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(f"{self.prefix}_{name}", doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, *labels: str, buckets: Sequence[float]) -> Histogram:
        return Histogram(
            f"{self.prefix}_{name}", doc, labels, buckets=buckets, registry=self.registry
        )
