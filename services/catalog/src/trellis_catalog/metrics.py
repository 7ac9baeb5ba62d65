"""Prometheus metrics of the catalog, read from its state when scraped.

The catalog's figures (documents by state, services, identities, proxies, the last flush)
are facts it already keeps; a collector reads them at scrape time instead of mirroring each
change into gauges. A document in ``error`` or ``ignored`` state is the spec directory's
count of rejected records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from trellis_catalog.catalog import Catalog

STATES = ("valid", "warning", "error", "ignored")


class CatalogCollector(Collector):
    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        catalog = self._catalog
        documents = GaugeMetricFamily(
            "trellis_catalog_documents",
            "Mesh documents by status (error and ignored ones are not in force)",
            labels=["state"],
        )
        counts = Counter(status.state for status in catalog.spec.statuses.values())
        for state in STATES:
            documents.add_metric([state], counts.get(state, 0))
        yield documents
        yield GaugeMetricFamily(
            "trellis_catalog_services", "Services known", value=len(catalog.services)
        )
        yield GaugeMetricFamily(
            "trellis_catalog_identities", "Identities with a view", value=len(catalog.policies)
        )
        yield GaugeMetricFamily(
            "trellis_catalog_proxies", "Proxies known (expected or connected)",
            value=len(catalog.proxies),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "trellis_catalog_last_flush_seconds",
            "How long the last recompute took",
            value=catalog.last_flush_seconds,
        )
        updates = CounterMetricFamily(
            "trellis_catalog_spec_updates",
            "Spec updates: built from every document, or patched (access policy edits alone)",
            labels=["how"],
        )
        for how in ("built", "patched"):
            updates.add_metric([how], catalog.spec_updates.get(how, 0))
        yield updates


def register(registry: CollectorRegistry, catalog: Catalog) -> None:
    registry.register(CatalogCollector(catalog))
