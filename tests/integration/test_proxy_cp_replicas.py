"""proxy-cp replicas: two processes on one xDS port (SO_REUSEPORT), each following the
catalog on its own. A proxy may land on either and gets the same configuration, with the
same versions; when the replica a proxy is on dies, the proxy reconnects to the other with
no stale configuration, and traffic between sidecars never fails."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from trellis_testing import eventually
from trellis_testing.mesh import BOOKSTORE, Mesh, Sidecar, bookstore
from trellis_testing.redis_server import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mesh(tmp_path: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
    mesh = Mesh(tmp_path, state_dir, redis_server, spec_dir, proxy_cp_replicas=2)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()


def serving(mesh: Mesh) -> dict[str, set[str]]:
    """Each live replica's instance name -> the proxies connected to it."""
    found = {}
    for replica in mesh.proxy_cps:
        if replica.process is not None and replica.process.poll() is None:
            listed = replica.get("/v1/proxies").json()["proxies"]
            found[replica.instance] = {p["proxy"] for p in listed}
    return found


def connected(mesh: Mesh, names: set[str]) -> None:
    asyncio.run(
        eventually(
            lambda: set().union(*serving(mesh).values()) >= names,
            timeout=30,
            message="every sidecar connected",
        )
    )


def versions(sidecar: Sidecar) -> dict[str, str]:
    """The versions of the clusters and routes the sidecar accepted: its identity's, the
    same for every sidecar of it (listeners differ: each sidecar has its own ports)."""
    dump = sidecar.envoy.get("/config_dump").json()
    found = {}
    for config in dump["configs"]:
        kind = config["@type"].rsplit(".", 1)[-1]
        if "version_info" in config and kind != "ListenersConfigDump":
            found[kind] = config["version_info"]
        for route in config.get("dynamic_route_configs", []):
            found[f"route {route['route_config']['name']}"] = route["version_info"]
        for cluster in config.get("dynamic_active_clusters", []):
            found[f"cluster {cluster['cluster']['name']}"] = cluster["version_info"]
    return found


@pytest.mark.parametrize("death", ["crash", "stop"])
def test_a_replica_dies_under_traffic_and_its_proxies_move_with_no_failure(
    mesh: Mesh, death: str
) -> None:
    """``crash``: SIGKILL. ``stop``: SIGTERM, as a rolling update or a scale-down stops a
    replica: it ends its proxies' streams at once (UNAVAILABLE), so they move then."""
    v1, v2, buyer = bookstore(mesh)
    # both replicas listen on the one xDS port
    ports = {r.endpoint.grpc_address.rsplit(":", 1)[1] for r in mesh.proxy_cps}
    assert len(ports) == 1, ports

    # more sidecars of bookbuyer's identity (SotW, as the ones compared must be), until the
    # kernel has spread them over both replicas
    extra: list[Sidecar] = []
    on: dict[str, str] = {}
    while len(set(on.values())) < 2:
        assert len(extra) < 16, f"every stream landed on one replica: {on}"
        extra.append(mesh.onboard(f"buyer-{len(extra)}", "bookbuyer", "bookbuyer", "bookbuyer"))
        sidecars = [v1, v2, buyer, *extra]
        names = {s.common_name for s in sidecars}
        connected(mesh, names)
        spread = serving(mesh)
        on = {
            s.common_name: r for r, found in spread.items() for s in extra if s.common_name in found
        }

    # the same configuration, the same versions, whichever replica serves a proxy (once
    # each sidecar took what its replica last pushed: a just-onboarded one may be a push
    # behind for a moment)
    compared = [next(s for s in extra if on[s.common_name] == replica) for replica in spread]

    def same_versions() -> bool:
        first, second = (versions(sidecar) for sidecar in compared)
        return first == second

    asyncio.run(eventually(same_versions, timeout=15, message="the same versions on both"))
    on = {
        s.common_name: r for r, found in spread.items() for s in sidecars if s.common_name in found
    }

    results: Counter[int] = Counter()
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                results[buyer.get(BOOKSTORE, "/books-bought", timeout=5).status_code] += 1
            except httpx.HTTPError:
                results[0] += 1

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        asyncio.run(eventually(lambda: results[200] >= 10, timeout=10, message="traffic flows"))
        victim_name = on[buyer.common_name]
        victim = next(r for r in mesh.proxy_cps if r.instance == victim_name)
        survivor = next(r for r in mesh.proxy_cps if r.instance != victim_name)
        moved = spread[victim_name]
        if death == "crash":
            victim.kill()
        else:
            assert victim.stop() == 0
            stopped = [line for line in victim.logs().splitlines() if "grpc.stopped" in line]
            # its xDS server ended each stream it held (the other servers held none of them)
            ended = [int(line.rsplit("streams_ended=", 1)[1].split()[0]) for line in stopped]
            assert max(ended) >= len(moved), stopped

        def reconnected() -> bool:
            listed = {p["proxy"] for p in survivor.get("/v1/proxies").json()["proxies"]}
            return listed >= names

        asyncio.run(eventually(reconnected, timeout=30, interval=0.2, message="moved over"))

        # no stale configuration: a change made after the death reaches the moved proxies
        split = mesh.spec_dir / "traffic-split.yaml"
        split.write_text(split.read_text().replace("weight: 20", "weight: 0"))

        def only_v1() -> bool:
            seen = {buyer.get(BOOKSTORE, "/books-bought").json()["app"] for _ in range(20)}
            return seen == {"v1"}

        asyncio.run(eventually(only_v1, timeout=20, interval=0.3, message="new split"))
    finally:
        stop.set()
        thread.join(10)
    assert results[200] > 20, results
    assert set(results) == {200}, results  # not one request failed
    assert moved  # the dead replica did serve proxies, which moved
