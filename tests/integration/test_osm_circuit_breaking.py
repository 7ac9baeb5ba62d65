"""OSM's UpstreamTrafficSetting connection settings against real Envoy sidecars.

bookstore-v1 answers slowly; an UpstreamTrafficSetting caps its clients at one request in
flight and one waiting. Eight requests at once from bookbuyer: the ones over the cap are
refused by bookbuyer's own sidecar (503, ``x-envoy-overloaded``) without reaching the app,
and Envoy counts the overflow. Without the setting, all eight pass.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from trellis_common.testing import eventually
from trellis_common.testing.mesh import Mesh, Sidecar, bookstore

pytestmark = pytest.mark.integration

V1 = "bookstore-v1.bookstore:14001"
CLUSTER = "bookstore/bookstore-v1|14001"
SETTING = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: bookstore-v1, namespace: bookstore}
spec:
  host: bookstore-v1.bookstore.svc.cluster.local
  connectionSettings:
    http: {maxRequests: 1, maxPendingRequests: 1}
"""


def burst(buyer: Sidecar, count: int) -> list[httpx.Response]:
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: buyer.get(V1, "/books-bought", timeout=10), range(count)))


def test_connection_settings_cap_what_clients_send(mesh: Mesh) -> None:
    _v1, _v2, buyer = bookstore(mesh)
    v1_app = next(app for app in mesh.apps if app.name == "v1")
    v1_app.delay = 0.5
    assert [r.status_code for r in burst(buyer, 8)] == [200] * 8  # thresholds off by default

    (mesh.spec_dir / "circuit-breaking.yaml").write_text(SETTING)

    def capped() -> bool:
        dump = buyer.envoy.get("/config_dump?resource=dynamic_active_clusters").text
        return '"max_pending_requests": 1' in dump

    try:
        # the updated cluster is active once its load assignment follows the CDS update
        # (proxy-cp re-sends it: Envoy's delta stream does not ask), well before the 15 s
        # initial fetch timeout would make it active with no endpoints
        asyncio.run(eventually(capped, timeout=10, interval=0.2, message="thresholds active"))
    except AssertionError:
        warming = buyer.envoy.get("/config_dump?resource=dynamic_warming_clusters").text
        proxies = mesh.proxies()
        raise AssertionError(f"warming: {warming[:3000]}\nproxies: {proxies}") from None
    before = v1_app.requests
    answers = burst(buyer, 8)
    codes = sorted(r.status_code for r in answers)
    assert codes.count(200) >= 1
    assert codes.count(503) >= 4, codes  # at most one in flight and one waiting at a time
    assert all(
        r.headers.get("x-envoy-overloaded") == "true" for r in answers if r.status_code == 503
    )
    assert v1_app.requests - before == codes.count(200)  # refused ones never left the client
    # Envoy counts each refusal: over maxRequests (active) or over maxPendingRequests
    refused = sum(
        buyer.envoy.stat(f"cluster.{CLUSTER}.upstream_rq_{kind}_overflow")
        for kind in ("active", "pending")
    )
    assert refused == codes.count(503)
