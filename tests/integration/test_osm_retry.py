"""OSM's Retry policy against real Envoy sidecars, as OSM v1.2 applies it.

The bookstore mesh with a Retry from bookbuyer's service account to the bookstore service:
with MeshConfig's ``featureFlags.enableRetryPolicy`` off it has no effect (and its status
says so); turned on, the client's routes retry 5xx, and ``numRetries`` counts retries (a
request runs at most numRetries + 1 times).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from trellis_testing import eventually
from trellis_testing.mesh import BOOKSTORE, Mesh, bookstore

pytestmark = pytest.mark.integration

RETRY = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Retry
metadata: {name: retry-bookstore, namespace: bookbuyer}
spec:
  source: {kind: ServiceAccount, name: bookbuyer, namespace: bookbuyer}
  destinations:
  - {kind: Service, name: bookstore, namespace: bookstore}
  retryPolicy:
    retryOn: "5xx"
    perTryTimeout: 2s
    numRetries: 2
    retryBackoffBaseInterval: 10ms
"""


def status_of(mesh: Mesh, key: str) -> dict[str, Any]:
    """The catalog's status of a document (empty while it has not read it)."""
    listed = mesh.processes["catalog"].get("/v1/resources").json()
    found: list[dict[str, Any]] = [s for s in listed["resources"] if s["key"] == key]
    return found[0] if found else {}


def test_retry_applies_only_with_the_feature_flag_and_counts_retries(mesh: Mesh) -> None:
    _v1, _v2, buyer = bookstore(mesh)
    apps = mesh.apps
    (mesh.spec_dir / "retry.yaml").write_text(RETRY)

    def noted() -> bool:
        status = status_of(mesh, "Retry bookbuyer/retry-bookstore")
        return "enableRetryPolicy is off" in status.get("reason", "")

    asyncio.run(eventually(noted, timeout=10, interval=0.2, message="Retry status says off"))
    for app in apps:
        app.fail_next = 1
    assert buyer.get(BOOKSTORE, "/books-bought").status_code == 503  # not retried
    for app in apps:
        app.fail_next = 0

    config = mesh.spec_dir / "meshconfig.yaml"
    config.write_text(config.read_text() + "  featureFlags:\n    enableRetryPolicy: true\n")

    def envoy_retries() -> bool:
        dump = buyer.envoy.get("/config_dump?resource=dynamic_route_configs").text
        return '"retry_on": "5xx"' in dump

    asyncio.run(eventually(envoy_retries, timeout=15, interval=0.2, message="routes retry"))
    assert status_of(mesh, "Retry bookbuyer/retry-bookstore")["state"] == "valid"

    # each app fails its next request once: at most two failures, then a success
    for app in apps:
        app.fail_next = 1
    before = sum(app.requests for app in apps)
    assert buyer.get(BOOKSTORE, "/books-bought").status_code == 200
    assert sum(app.requests for app in apps) - before in (2, 3)
    assert (
        buyer.envoy.stat("cluster.bookstore/bookstore-v1|14001.upstream_rq_retry")
        + (buyer.envoy.stat("cluster.bookstore/bookstore-v2|14001.upstream_rq_retry"))
        >= 1
    )

    # numRetries: 2 means three attempts, never a fourth
    for app in apps:
        app.fail_next = 10
    before = sum(app.requests for app in apps)
    assert buyer.get(BOOKSTORE, "/books-bought").status_code == 503
    assert sum(app.requests for app in apps) - before == 3
