"""Locality failover with real Envoy sidecars: a client prefers its own locality's
endpoints, fails over to another locality when outlier detection ejects them, and comes
back when they recover.

bookstore-v1 runs two workloads, registered in two localities (``trellis vm register
--locality``): one in the client's own (``eu-west/a/1``), one across the ocean
(``us-east/b/1``). The client, bookbuyer, is onboarded with ``trellis vm bootstrap
--locality eu-west/a/1`` (CLI, injector, bootstrap: its Envoy reports the locality in
``node.locality``), so proxy-cp knows where it is. A second bookbuyer sidecar without a
locality shows what every proxy got before.

- Off by default: no priorities, both workloads share the traffic, whatever the client's
  locality; an UpstreamTrafficSetting's ``outlierDetection`` alone does not change that.
- With MeshConfig's ``traffic.enableLocalityFailover`` too, on the service with outlier
  detection: the client's own locality is priority 0 and the other priority 1, so all its
  traffic goes to eu-west.
  When the eu-west workload fails, outlier detection ejects it and the traffic moves to
  us-east; when it answers again and its ejection ends, the traffic comes back. The client
  without a locality still has one priority.

Every wait is on a condition (Envoy's admin API, the answers), none on a fixed time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from trellis_testing import eventually
from trellis_testing.apps import AppServer
from trellis_testing.baseline import Baseline, module_mesh
from trellis_testing.envoy import Envoy
from trellis_testing.mesh import Mesh, Sidecar
from trellis_testing.ports import free_port

# one mesh for the module: its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("locality-failover")]

ROOT = Path(__file__).resolve().parents[2]
ONBOARDED = (  # (namespace, service, account) of every sidecar the tests start
    ("bookstore", "bookstore-v1", "bookstore"),
    ("bookbuyer", "bookbuyer", "bookbuyer"),
)
HERE, THERE = "eu-west/a/1", "us-east/b/1"
V1 = "bookstore-v1.bookstore:14001"
CLUSTER = "bookstore/bookstore-v1|14001"
# eject after one 5xx, for one second (times the host's ejections), checked every second;
# at most half of the two hosts (one) out at a time
OUTLIERS = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: bookstore-v1, namespace: bookstore}
spec:
  host: bookstore-v1.bookstore.svc.cluster.local
  outlierDetection:
    consecutive5xxErrors: 1
    interval: 1s
    baseEjectionTime: 1s
    maxEjectionPercent: 50
"""
MESH_FAILOVER = "    enableLocalityFailover: true\n"  # under the example's spec.traffic


shared, mesh = module_mesh(
    "locality-failover",
    ROOT / "examples" / "bookstore",
    lambda tmp, state, redis, spec: Mesh(tmp, state, redis, spec, injector=True),
    lambda mesh: Baseline(mesh, ONBOARDED),
)


def workload(mesh: Mesh, name: str, locality: str) -> tuple[Sidecar, AppServer]:
    """A bookstore-v1 workload behind its sidecar, registered in ``locality``."""
    app = mesh.app(name)
    sidecar = mesh.onboard(f"v1-{name}", "bookstore", "bookstore-v1", "bookstore", app.port)
    done = mesh.trellis(
        *("vm", "register", "-n", "bookstore", "--name", f"v1-{name}"),
        *("--service", "bookstore-v1", "--address", "127.0.0.1"),
        *("--port", f"http={sidecar.inbound_port}", "--service-account", "bookstore"),
        *("--locality", locality),
    )
    assert done.returncode == 0, done.stderr
    return sidecar, app


def client_in(mesh: Mesh, locality: str) -> Sidecar:
    """bookbuyer's sidecar onboarded as a user does it: ``trellis vm bootstrap
    --locality``, then Envoy with the bootstrap the CLI wrote."""
    out = mesh.tmp / "proxies" / "buyer-here"  # the baseline removes it after the test
    inbound, outbound = free_port(), free_port()
    done = mesh.trellis(
        *("vm", "bootstrap", "-n", "bookbuyer", "--service", "bookbuyer"),
        *("--app-port", "0", "--inbound-port", str(inbound)),
        *("--outbound-port", str(outbound), "--admin-port", str(free_port())),
        *("--locality", locality, "--out", str(out)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"--locality {locality}" in done.stdout  # the registration it suggests
    bootstrap = yaml.safe_load((out / "envoy.yaml").read_text())
    assert bootstrap["node"]["locality"] == {"region": "eu-west", "zone": "a", "sub_zone": "1"}
    envoy = Envoy(bootstrap, mesh.tmp / "envoy", "buyer-here").start()
    sidecar = Sidecar(envoy, bootstrap["node"]["id"], inbound, outbound)
    mesh.sidecars.append(sidecar)  # stopped by the baseline, as onboarded ones are
    envoy.wait_ready()
    return sidecar


def priorities(client: Sidecar, ports: dict[int, str]) -> dict[str, int]:
    """The priority of each workload (by its inbound port's name in ``ports``) in the
    client's cluster of bookstore-v1, as Envoy's /clusters lists its hosts."""
    found: dict[str, int] = {}
    for line in client.envoy.get("/clusters").text.splitlines():
        head, _, value = line.rpartition("::")
        prefix = f"{CLUSTER}::127.0.0.1:"
        if head.startswith(prefix) and head.endswith("::priority"):
            port = int(head[len(prefix) :].split("::")[0])
            if port in ports:
                found[ports[port]] = int(value)
    return found


def answered_by(client: Sidecar) -> str:
    """Which app answered one request ("5xx" for a failure)."""
    try:
        answer = client.get(V1, "/books-bought")
    except httpx.HTTPError:
        return "error"
    return str(answer.json()["app"]) if answer.status_code == 200 else "5xx"


def wait(condition: Callable[[], bool], message: str, timeout: float = 30) -> None:
    asyncio.run(eventually(condition, timeout=timeout, interval=0.1, message=message))


def test_the_client_prefers_its_locality_and_fails_over_to_the_other(mesh: Mesh) -> None:
    here, here_app = workload(mesh, "here", HERE)
    there, _there_app = workload(mesh, "there", THERE)
    ports = {here.inbound_port: "here", there.inbound_port: "there"}
    for sidecar in (here, there):
        sidecar.envoy.wait_ready()
    client = client_in(mesh, HERE)
    plain = mesh.onboard("buyer-plain", "bookbuyer", "bookbuyer", "bookbuyer")
    plain.envoy.wait_ready()
    # proxy-cp keeps the located client in a group (and a snapshot) of its locality
    groups = [g for r in mesh.proxy_cps for g in r.get("/v1/proxies").json()["groups"]]
    located = [g["key"] for g in groups if client.common_name in g["proxies"]]
    assert located, groups
    assert all(key.endswith(f"|locality:{HERE}") for key in located), groups

    # off by default: one priority, and round robin over both localities
    def both_known() -> bool:
        return all(priorities(c, ports) == {"here": 0, "there": 0} for c in (client, plain))

    wait(both_known, "both workloads at priority 0 in both clients")
    assert {answered_by(client) for _ in range(10)} == {"here", "there"}

    # outlier detection alone: still one priority (off mesh-wide)
    (mesh.spec_dir / "outliers.yaml").write_text(OUTLIERS)

    def detecting() -> bool:
        dump = client.envoy.get("/config_dump?resource=dynamic_active_clusters").text
        return '"consecutive_5xx": 1' in dump

    wait(detecting, "outlier detection on in the client")
    assert priorities(client, ports) == {"here": 0, "there": 0}

    # on mesh-wide (MeshConfig): the client's own locality first, the other next
    config = mesh.spec_dir / "meshconfig.yaml"
    text = config.read_text()
    assert "  traffic:\n" in text
    config.write_text(text.replace("  traffic:\n", "  traffic:\n" + MESH_FAILOVER))

    def failover_on() -> bool:
        return priorities(client, ports) == {"here": 0, "there": 1}

    wait(failover_on, "the client's locality at priority 0, the other at 1")
    assert [answered_by(client) for _ in range(20)] == ["here"] * 20
    assert priorities(plain, ports) == {"here": 0, "there": 0}  # no locality: as before

    # its locality fails: ejected, and the traffic moves to the other one
    here_app.fail_next = 10**9
    answers: list[str] = []

    def moved() -> bool:
        answers.append(answered_by(client))
        return answers[-10:] == ["there"] * 10

    wait(moved, "the traffic moved to the other locality")
    assert "5xx" in answers  # the failures that ejected it reached the client
    ejected = f"cluster.{CLUSTER}.outlier_detection.ejections_enforced_total"
    assert client.envoy.stat(ejected) >= 1

    # it answers again: once its ejection ends, the traffic comes back
    here_app.fail_next = 0
    back: list[str] = []

    def returned() -> bool:
        back.append(answered_by(client))
        return back[-10:] == ["here"] * 10

    wait(returned, "the traffic came back to the client's locality", timeout=60)
    assert "5xx" not in back[back.index("here") :]
