"""Every sidecar serves its Envoy statistics for Prometheus on a port of its bootstrap, and
nothing else of its admin API (which can dump and change the proxy) on that port."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from trellis_identity.trustctx import system_context
from trellis_testing import eventually
from trellis_testing.mesh import Mesh
from trellis_testing.ports import free_port

pytestmark = pytest.mark.integration


def test_a_sidecar_serves_prometheus_stats_and_only_them(mesh: Mesh) -> None:
    stats_port = free_port()
    sidecar = mesh.onboard("buyer", "bookbuyer", "bookbuyer", "bookbuyer", stats_port=stats_port)
    sidecar.envoy.wait_ready()
    url = f"http://127.0.0.1:{stats_port}"

    def scraped() -> bool:
        try:
            return (
                httpx.get(f"{url}/stats/prometheus", timeout=2, verify=system_context()).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    asyncio.run(eventually(scraped, timeout=15, interval=0.2, message="stats served"))
    body = httpx.get(f"{url}/stats/prometheus", timeout=5).text
    assert "# TYPE envoy_cluster_upstream_cx_total counter" in body
    assert 'envoy_cluster_upstream_cx_total{envoy_cluster_name="trellis-xds"}' in body
    for path in ("/config_dump", "/quitquitquit", "/stats", "/stats/prometheus/../config_dump"):
        assert httpx.get(f"{url}{path}", timeout=5).status_code == 404, path
    assert httpx.post(f"{url}/quitquitquit", timeout=5).status_code == 404
    assert sidecar.envoy.alive()
