"""The one event path under a pub/sub outage: consumers resync and converge.

A mesh of real processes runs OSM's bookstore behind real Envoy sidecars. Redis is frozen
(SIGSTOP: connections stay open, nothing is delivered), and while it is frozen the
TrafficSplit is edited so that bookbuyer's traffic goes to bookstore-v2 only. No signal of
that change can be delivered. The consumers notice the silent subscription (their
``signals`` loop goes down, and ``/readyz`` says so); once Redis is back, the catalog's
kept signal goes out, every follower resyncs, and bookbuyer's Envoy converges on the new
split.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from trellis_testing import RedisServer, eventually
from trellis_testing.mesh import BOOKSTORE, Mesh, bookstore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ALL_TO_V2 = """\
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: bookstore-split, namespace: bookstore}
spec:
  service: bookstore.bookstore
  backends:
  - service: bookstore-v1
    weight: 0
  - service: bookstore-v2
    weight: 100
"""


def loops(mesh: Mesh, service: str) -> dict[str, dict[str, Any]]:
    return {
        loop["name"]: loop for loop in mesh.processes[service].get("/v1/status").json()["loops"]
    }


def not_ready(mesh: Mesh, service: str) -> str:
    """The body of a 503 ``/readyz``, or "" while the service is ready."""
    response = mesh.processes[service].get("/readyz")
    return response.text if response.status_code == 503 else ""


def apps_answering(mesh: Mesh, buyer: Any, calls: int = 20) -> set[str]:
    seen = set()
    for _ in range(calls):
        response = buyer.get(BOOKSTORE, "/books-bought", timeout=5)
        if response.status_code == 200:
            seen.add(response.json()["app"])
    return seen


def test_consumers_resync_and_converge_after_pub_sub_was_frozen(
    mesh: Mesh, redis_server: RedisServer
) -> None:
    _, _, buyer = bookstore(mesh)
    assert "v1" in apps_answering(mesh, buyer, calls=40)  # 80/20 to start with

    redis_server.pause()
    try:
        (mesh.spec_dir / "traffic-split.yaml").write_text(ALL_TO_V2)
        # the silent subscription is noticed: each consumer says why it is not ready
        for service in ("catalog", "proxy-cp"):

            def reports_it(service: str = service) -> bool:
                down = not loops(mesh, service)["signals"]["up"]
                return down and "signals" in not_ready(mesh, service)

            asyncio.run(
                eventually(
                    reports_it, timeout=30, interval=0.2, message=f"{service} says signals down"
                )
            )
    finally:
        redis_server.resume()

    def converged() -> bool:
        return apps_answering(mesh, buyer) == {"v2"}

    started = time.monotonic()
    asyncio.run(eventually(converged, timeout=30, interval=0.2, message="the split reaches Envoy"))
    print(f"converged {time.monotonic() - started:.2f}s after Redis was resumed")
    for service in ("catalog", "proxy-cp"):

        def all_up(service: str = service) -> bool:
            return all(loop["up"] for loop in loops(mesh, service).values())

        asyncio.run(
            eventually(all_up, timeout=30, interval=0.2, message=f"every loop of {service} up")
        )
        status = loops(mesh, service)
        assert status["signals"]["restarts"] >= 1, status  # it was down, and came back
