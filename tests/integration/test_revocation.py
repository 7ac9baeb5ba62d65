"""Revoked access is revoked now (issue 11): real Envoy sidecars, 1 request per second on a
pooled connection, and a policy narrowed or permissive mode turned off under it.

The HTTP rules ride on the inbound route (RDS), not in the listener, so the change must
reach the very connection the client sidecar already holds: the first request more than
1 s after proxy-cp pushed the new route configuration is refused, no listener is replaced
(its LDS version and Envoy's ``listener_modified`` do not move) and no connection closes.

Both tests run on one mesh, started once for the module (``shared``): they revoke by
editing spec documents (an HTTPRouteGroup, the MeshConfig), which :class:`Baseline` puts
back after each test, with the sidecars, apps and workloads the test started; no
certificate or identity is revoked, so neither test takes away what the other needs.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from trellis_testing import eventually
from trellis_testing.baseline import Baseline, module_mesh
from trellis_testing.mesh import BOOKSTORE, Mesh, Sidecar, bookstore

# one mesh for the module: its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("revocation")]

ROOT = Path(__file__).resolve().parents[2]
ONBOARDED = (  # (namespace, service, account) of every sidecar the tests start
    ("bookstore", "bookstore-v1", "bookstore"),
    ("bookstore", "bookstore-v2", "bookstore"),
    ("bookbuyer", "bookbuyer", "bookbuyer"),
)


shared, mesh = module_mesh(
    "revocation", ROOT / "examples" / "bookstore", Mesh, lambda mesh: Baseline(mesh, ONBOARDED)
)


GRACE = 1.0
"""The acceptance bound: requests started this long after the push see the new rules."""


@dataclass
class Paced:
    """GETs through the client sidecar at 1 per second, on one keep-alive connection."""

    sidecar: Sidecar
    path: str
    seen: list[tuple[float, int]] = field(default_factory=list)  # (monotonic start, status)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(
            base_url=f"http://127.0.0.1:{self.sidecar.outbound_port}",
            headers={"host": BOOKSTORE},
            timeout=5,
        ) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                try:
                    self.seen.append((started, client.get(self.path).status_code))
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                self.stop.wait(max(0.0, started + 1.0 - time.monotonic()))  # the rate: 1/s

    def after(self, moment: float) -> list[int]:
        return [status for started, status in list(self.seen) if started > moment]


@pytest.fixture
def paced() -> Iterator[Callable[[Sidecar, str], Paced]]:
    running: list[tuple[Paced, threading.Thread]] = []

    def start(sidecar: Sidecar, path: str) -> Paced:
        load = Paced(sidecar, path)
        thread = threading.Thread(target=load.run, name=f"paced {path}")
        thread.start()
        running.append((load, thread))
        return load

    yield start
    for load, thread in running:
        load.stop.set()
        thread.join(10)


def versions(mesh: Mesh, sidecar: Sidecar, kind: str) -> str:
    (proxy,) = (p for p in mesh.proxies() if p["proxy"] == sidecar.common_name)
    return str(proxy["types"][kind]["sent_version"])


def pushed(mesh: Mesh, stores: tuple[Sidecar, ...], before: dict[str, str]) -> float:
    """Wait until proxy-cp has sent every bookstore sidecar a new inbound route
    configuration; return when that was seen (at most one poll after the push)."""

    def moved() -> bool:
        return all(versions(mesh, s, "rds") != before[s.common_name] for s in stores)

    asyncio.run(eventually(moved, timeout=30, interval=0.05, message="new RDS pushed"))
    return time.monotonic()


def judged_by_new_rules(load: Paced, push: float, count: int = 3) -> list[int]:
    """The statuses of the first ``count`` requests started more than GRACE after the push."""

    def enough() -> bool:
        return len(load.after(push + GRACE)) >= count

    asyncio.run(eventually(enough, timeout=count + 10, interval=0.1, message="paced requests"))
    return load.after(push + GRACE)[:count]


def listener_state(mesh: Mesh, sidecar: Sidecar) -> tuple[str, int]:
    return versions(mesh, sidecar, "lds"), sidecar.envoy.stat("listener_manager.listener_modified")


def closed_upstream(buyer: Sidecar) -> int:
    return sum(
        buyer.envoy.stat(f"cluster.bookstore/bookstore-{v}|14001.upstream_cx_destroy")
        for v in ("v1", "v2")
    )


def test_narrowing_a_route_refuses_the_next_request_on_a_pooled_connection(
    mesh: Mesh, paced: Callable[[Sidecar, str], Paced]
) -> None:
    v1, v2, buyer = bookstore(mesh)
    load = paced(buyer, "/books-bought")
    asyncio.run(
        eventually(lambda: load.after(0).count(200) >= 3, timeout=15, message="traffic flows")
    )
    rds = {s.common_name: versions(mesh, s, "rds") for s in (v1, v2)}
    listeners = {s.common_name: listener_state(mesh, s) for s in (v1, v2)}
    closed = closed_upstream(buyer)

    # narrow the HTTPRouteGroup: /books-bought is no longer in it
    access = mesh.spec_dir / "access.yaml"
    access.write_text(
        access.read_text().replace("pathRegex: /books-bought", "pathRegex: /books-bought/archive")
    )
    push = pushed(mesh, (v1, v2), rds)

    # no allowed route matches any more: 404 from the destination's sidecar, as in OSM
    assert judged_by_new_rules(load, push) == [404, 404, 404], load.seen
    assert load.errors == []
    # the listeners stayed as they were, and the pooled connections stayed open
    assert {s.common_name: listener_state(mesh, s) for s in (v1, v2)} == listeners
    assert closed_upstream(buyer) == closed
    assert v1.envoy.stat("http.inbound.rq_direct_response") + v2.envoy.stat(
        "http.inbound.rq_direct_response"
    )  # the inbound 404 route answered them


def test_permissive_off_refuses_the_next_request_outside_the_traffic_target(
    mesh: Mesh, paced: Callable[[Sidecar, str], Paced]
) -> None:
    config = mesh.spec_dir / "meshconfig.yaml"
    config.write_text(
        config.read_text().replace(
            "enablePermissiveTrafficPolicyMode: false", "enablePermissiveTrafficPolicyMode: true"
        )
    )
    v1, v2, buyer = bookstore(mesh)
    load = paced(buyer, "/admin")  # in no HTTPRouteGroup: only permissive mode allows it
    asyncio.run(
        eventually(lambda: load.after(0).count(200) >= 3, timeout=20, message="permissive 200s")
    )
    rds = {s.common_name: versions(mesh, s, "rds") for s in (v1, v2)}
    listeners = {s.common_name: listener_state(mesh, s) for s in (v1, v2)}
    closed = closed_upstream(buyer)

    config.write_text(
        config.read_text().replace(
            "enablePermissiveTrafficPolicyMode: true", "enablePermissiveTrafficPolicyMode: false"
        )
    )
    push = pushed(mesh, (v1, v2), rds)

    assert judged_by_new_rules(load, push) == [404, 404, 404], load.seen  # no route allows it
    assert load.errors == []
    assert {s.common_name: listener_state(mesh, s) for s in (v1, v2)} == listeners
    assert closed_upstream(buyer) == closed
    # what the TrafficTarget allows still flows
    assert buyer.get(BOOKSTORE, "/books-bought").status_code == 200
