"""OSM's local rate limits (UpstreamTrafficSetting ``rateLimit.local``, ``httpRoutes``)
against real Envoy sidecars: the destination's sidecar counts, and the exact number of
requests gets through.

Both tests run on one mesh, started once for the module (``shared``): each onboards its own
sidecars (so each has fresh rate-limit buckets), apps and workloads, and writes its own
spec document, all of which :class:`Baseline` undoes after it.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from trellis_testing import eventually
from trellis_testing.apps import TcpApp
from trellis_testing.baseline import Baseline, module_mesh
from trellis_testing.mesh import Mesh, bookstore
from trellis_testing.ports import free_port

# one mesh for the module: its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("osm-rate-limit")]

ROOT = Path(__file__).resolve().parents[2]
ONBOARDED = (  # (namespace, service, account) of every sidecar the tests start
    ("bookstore", "bookstore-v1", "bookstore"),
    ("bookstore", "bookstore-v2", "bookstore"),
    ("bookbuyer", "bookbuyer", "bookbuyer"),
    ("bookstore", "ledger", "ledger"),
)

V1 = "bookstore-v1.bookstore:14001"

LIMITS = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: bookstore-v1-limits, namespace: bookstore}
spec:
  host: bookstore-v1.bookstore.svc.cluster.local
  rateLimit:
    local:
      http:
        requests: 5
        unit: minute
        burst: 2
        responseHeadersToAdd: [{name: x-rate-limited, value: "true"}]
  httpRoutes:
  - path: ".*a-book.*new"
    rateLimit: {local: {requests: 1, unit: hour}}
"""


shared, mesh = module_mesh(
    "rate-limit", ROOT / "examples" / "bookstore", Mesh, lambda mesh: Baseline(mesh, ONBOARDED)
)


def limited_config(mesh: Mesh, text: str) -> bool:
    v1 = next(s for s in mesh.sidecars if "bookstore-v1" in s.common_name)
    dump = v1.envoy.get("/config_dump?resource=dynamic_route_configs").text
    return text in dump


def test_an_http_limit_lets_exactly_requests_plus_burst_through(mesh: Mesh) -> None:
    _v1, _v2, buyer = bookstore(mesh)
    app = mesh.apps[0]
    (mesh.spec_dir / "limits.yaml").write_text(LIMITS)
    asyncio.run(
        eventually(
            lambda: limited_config(mesh, "local_ratelimit"),
            timeout=20,
            interval=0.2,
            message="the limit reached bookstore-v1's sidecar",
        )
    )
    before = app.requests
    answers = [buyer.get(V1, "/books-bought") for _ in range(12)]
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 7, codes  # 5 per minute, plus a burst of 2
    assert codes.count(429) == 5, codes
    assert codes[:7] == [200] * 7
    assert all(a.headers.get("x-rate-limited") == "true" for a in answers if a.status_code == 429)
    assert app.requests - before == 7  # the limited ones never reached the application

    # the route of httpRoutes has its own bucket: 1 per hour
    bought = [buyer.get(V1, "/buy-a-book/new").status_code for _ in range(3)]
    assert bought == [200, 429, 429]


TCP = """
apiVersion: v1
kind: Service
metadata: {name: ledger, namespace: bookstore}
spec: {ports: [{name: tcp-ledger, port: PORT}]}
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: ledger-limits, namespace: bookstore}
spec:
  host: ledger.bookstore.svc.cluster.local
  rateLimit: {local: {tcp: {connections: 2, unit: minute, burst: 1}}}
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: TCPRoute
metadata: {name: ledger, namespace: bookstore}
spec: {matches: {ports: [PORT]}}
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: buyer-ledger, namespace: bookstore}
spec:
  destination: {kind: ServiceAccount, name: ledger, namespace: bookstore}
  sources: [{kind: ServiceAccount, name: bookbuyer, namespace: bookbuyer}]
  rules: [{kind: TCPRoute, name: ledger}]
"""


def test_a_tcp_limit_admits_exactly_connections_plus_burst(mesh: Mesh) -> None:
    port = free_port()
    (mesh.spec_dir / "ledger.yaml").write_text(TCP.replace("PORT", str(port)))
    app = TcpApp("ledger").start()
    try:
        ledger = mesh.onboard("ledger", "bookstore", "ledger", "ledger", app_port=app.port)
        mesh.register("ledger-a", "ledger", ledger.inbound_port, "ledger", port_name="tcp-ledger")
        buyer = mesh.onboard("bookbuyer", "bookbuyer", "bookbuyer", "bookbuyer")
        for proxy in (ledger, buyer):
            proxy.envoy.wait_ready()

        def listening() -> bool:
            dump = ledger.envoy.get("/config_dump?resource=dynamic_listeners").text
            outbound = buyer.envoy.get("/config_dump?resource=dynamic_listeners").text
            return "local_ratelimit" in dump and f"outbound-tcp|bookstore/ledger|{port}" in outbound

        asyncio.run(eventually(listening, timeout=30, interval=0.2, message="ledger limited"))

        def greeting() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
                conn.settimeout(5)
                try:
                    return conn.recv(64)
                except OSError:
                    return b""

        answers = [greeting() for _ in range(5)]
        assert answers[:3] == [b"ledger\n"] * 3, answers  # 2 per minute, plus a burst of 1
        assert answers[3:] == [b"", b""], answers
        assert app.connections == 3
    finally:
        app.stop()
