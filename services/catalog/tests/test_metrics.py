"""The catalog's metrics are read from its state when scraped."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

from trellis_catalog import metrics
from trellis_catalog.catalog import Catalog
from trellis_common.documents.base import Document, DocumentError


def test_documents_are_counted_by_state(
    docs_and_errors: Callable[[str], tuple[list[Document], list[DocumentError]]],
) -> None:
    documents, errors = docs_and_errors(
        """
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: UDPRoute
metadata: {name: grpc, namespace: shop}
spec: {}
---
apiVersion: v1
kind: Service
metadata: {name: Bad, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
"""
    )
    catalog = Catalog()
    catalog.set_documents(documents, errors)
    catalog.flush()
    registry = CollectorRegistry()
    metrics.register(registry, catalog)

    text = generate_latest(registry).decode()
    assert 'trellis_catalog_documents{state="valid"} 1.0' in text
    assert 'trellis_catalog_documents{state="ignored"} 1.0' in text
    assert 'trellis_catalog_documents{state="error"} 1.0' in text
    assert "trellis_catalog_services 1.0" in text
    assert 'trellis_catalog_spec_updates_total{how="built"} 1.0' in text
    assert 'trellis_catalog_spec_updates_total{how="patched"} 0.0' in text
