"""OSM's UpstreamTrafficSetting connection settings (and outlier detection) against real
Envoy sidecars.

bookstore-v1 answers slowly; an UpstreamTrafficSetting caps its clients at one request in
flight and one waiting. Eight requests at once from bookbuyer: the ones over the cap are
refused by bookbuyer's own sidecar (503, ``x-envoy-overloaded``) without reaching the app,
and Envoy counts the overflow. Without the setting, all eight pass.

With ``outlierDetection`` (Istio's field names: OSM has none), a second bookstore-v1
workload that fails every request is ejected after two 5xx in a row, and the healthy one
takes every request after that.

Both tests run on one mesh, started once for the module (``shared``): each onboards its own
sidecars, apps and workloads, and writes its own spec document, all of which
:class:`Baseline` undoes after it; every Envoy counter a test reads is of a sidecar the
test started itself.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from trellis_testing import eventually
from trellis_testing.baseline import Baseline, module_mesh
from trellis_testing.mesh import Mesh, Sidecar, bookstore

# one mesh for the module: its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("osm-circuit-breaking")]

ROOT = Path(__file__).resolve().parents[2]
ONBOARDED = (  # (namespace, service, account) of every sidecar the tests start
    ("bookstore", "bookstore-v1", "bookstore"),
    ("bookstore", "bookstore-v2", "bookstore"),
    ("bookbuyer", "bookbuyer", "bookbuyer"),
)

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


shared, mesh = module_mesh(
    "circuit-breaking",
    ROOT / "examples" / "bookstore",
    Mesh,
    lambda mesh: Baseline(mesh, ONBOARDED),
)


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


OUTLIERS = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: bookstore-v1, namespace: bookstore}
spec:
  host: bookstore-v1.bookstore.svc.cluster.local
  outlierDetection: {consecutive5xxErrors: 2, baseEjectionTime: 5m, maxEjectionPercent: 50}
"""


def test_outlier_detection_ejects_the_failing_workload(mesh: Mesh) -> None:
    _v1, _v2, buyer = bookstore(mesh)
    broken_app = mesh.app("v1-broken")
    broken = mesh.onboard(
        "bookstore-v1-b", "bookstore", "bookstore-v1", "bookstore", app_port=broken_app.port
    )
    mesh.register("v1-b", "bookstore-v1", broken.inbound_port)
    broken.envoy.wait_ready()

    def two_endpoints() -> bool:
        clusters = buyer.envoy.get("/clusters").text
        return (
            clusters.count(f"{CLUSTER}::127.0.0.1:") >= 2 * 1
            and clusters.count(f"{CLUSTER}::127.0.0.1:{broken.inbound_port}::health_flags::healthy")
            == 1
        )

    asyncio.run(eventually(two_endpoints, timeout=20, interval=0.2, message="both endpoints"))
    (mesh.spec_dir / "outliers.yaml").write_text(OUTLIERS)

    def detecting() -> bool:
        dump = buyer.envoy.get("/config_dump?resource=dynamic_active_clusters").text
        return '"consecutive_5xx": 2' in dump

    asyncio.run(eventually(detecting, timeout=10, interval=0.2, message="outlier detection on"))
    broken_app.fail_next = 1000  # every request to this workload fails from now on
    codes = [buyer.get(V1, "/books-bought").status_code for _ in range(30)]
    # two failures in a row eject it; round robin may send another before the second one
    assert codes.count(503) <= 3, codes
    assert codes[-20:] == [200] * 20, codes  # ejected: only the healthy workload answers
    assert buyer.envoy.stat(f"cluster.{CLUSTER}.outlier_detection.ejections_enforced_total") == 1
    assert broken_app.requests == codes.count(503)
