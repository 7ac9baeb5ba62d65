"""Endpoints by service account, as OSM sends them, against real Envoy sidecars.

bookstore-v1 gets a second workload running as another service account, which the bookstore
example's TrafficTarget does not allow bookbuyer to call. OSM sends a client only the
endpoints whose account it may reach, so every request still succeeds and none reaches the
other account's workload; a TrafficTarget for that account brings it in.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from trellis_testing import eventually
from trellis_testing.mesh import Mesh, bookstore

pytestmark = pytest.mark.integration

V1 = "bookstore-v1.bookstore:14001"
CANARY_TARGET = """
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: bookbuyer-access-canary, namespace: bookstore}
spec:
  destination: {kind: ServiceAccount, name: bookstore-canary, namespace: bookstore}
  rules:
  - {kind: HTTPRouteGroup, name: bookstore-service-routes}
  sources:
  - {kind: ServiceAccount, name: bookbuyer, namespace: bookbuyer}
"""


def eds_addresses(mesh: Mesh, common_name: str, cluster: str) -> list[int]:
    body = mesh.proxy_cp_of(common_name).get(f"/v1/proxies/{common_name}/config?type=eds").json()
    [assignment] = [a for a in body["resources"]["eds"] if a["cluster_name"] == cluster]
    return sorted(
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for group in assignment.get("endpoints", [])
        for e in group.get("lb_endpoints", [])
    )


def test_a_client_gets_only_the_endpoints_of_accounts_it_may_call(mesh: Mesh) -> None:
    v1, _v2, buyer = bookstore(mesh)
    canary_app = mesh.app("v1-canary")
    canary = mesh.onboard(
        "bookstore-v1-canary", "bookstore", "bookstore-v1", "bookstore-canary", canary_app.port
    )
    canary.envoy.wait_ready()
    mesh.register("v1-canary", "bookstore-v1", canary.inbound_port, account="bookstore-canary")
    cluster = "bookstore/bookstore-v1|14001"

    def catalog_has_both() -> bool:
        services = mesh.processes["catalog"].get("/v1/services").json()["services"]
        return any(s["name"] == "bookstore-v1" and s["endpoints"] == 2 for s in services)

    asyncio.run(eventually(catalog_has_both, timeout=15, message="both workloads known"))
    assert eds_addresses(mesh, buyer.common_name, cluster) == [v1.inbound_port]
    seen: Counter[int] = Counter()
    for _ in range(40):
        response = buyer.get(V1, "/books-bought")
        seen[response.status_code] += 1
    assert seen == Counter({200: 40})
    assert canary_app.requests == 0

    # a TrafficTarget for the other account: its endpoint joins, and it is called
    (mesh.spec_dir / "canary-access.yaml").write_text(CANARY_TARGET)
    wanted = sorted([v1.inbound_port, canary.inbound_port])
    asyncio.run(
        eventually(
            lambda: eds_addresses(mesh, buyer.common_name, cluster) == wanted,
            timeout=15,
            interval=0.2,
            message="the canary's endpoint reaches bookbuyer",
        )
    )
    for _ in range(40):
        assert buyer.get(V1, "/books-bought").status_code == 200
    assert canary_app.requests > 0
