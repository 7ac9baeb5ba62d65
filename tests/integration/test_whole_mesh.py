"""The path a newcomer takes: `trellis up` with the bookstore demo, then operating it.

Everything is a real process started by the CLI: Redis, the five services, four Envoy
sidecars, the apps and clients. The test reads the demo clients' counters (what a user
watches), edits the mesh documents, uses the CLI, and kills processes.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.dashboardpage import check_dashboard, dashboard_url
from trellis_cli import demo
from trellis_runtime import adminhttp
from trellis_testing import up
from trellis_testing.up import wait

# `trellis up` binds the default ports: never beside another test that does (xdist group)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.xdist_group("fixed-ports"),
]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("certmanager", "endpoints-vm", "catalog", "proxy-cp", "proxy-cp-2", "injector")


class Up(up.Up):
    """``trellis up`` with the demo, on a copy of examples/."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.spec = tmp / "spec"
        shutil.copytree(ROOT / "examples", self.spec)  # bookstore/ and grpc/, as `make run`

    def start_demo(self) -> None:
        self.start(
            "--spec-dir",
            str(self.spec),
            "--quiet",
            # two proxy-cp processes on the one xDS port: the demo's proxies are spread
            # over them, and everything below holds as with one
            "--proxy-cp-replicas",
            "2",
            env={"TRELLIS_DEMO_RATE": "40"},
        )

    def counts(self, client: str) -> Counter[str]:
        try:
            body = json.loads((self.state / "demo" / f"{client}.json").read_text())
        except (OSError, ValueError):
            return Counter()
        return Counter(body["counts"])

    def window(self, client: str, size: int, timeout: float = 60) -> Counter[str]:
        """What ``client`` got over its next ``size`` requests."""
        start = self.counts(client)
        wait(
            lambda: sum((self.counts(client) - start).values()) >= size,
            timeout,
            f"{client} made {size} requests",
        )
        return self.counts(client) - start

    def ready(self, service: str) -> bool:
        try:
            body = json.loads((self.state / "services" / f"{service}.json").read_text())
            url = body["admin_url"] + "/readyz"
            answer = adminhttp.request(self.state, service, "GET", url, timeout=2)
            return answer.status_code == 200
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            return False


def share(seen: Counter[str], key: str) -> float:
    return seen[key] / max(sum(seen.values()), 1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Up]:
    running = Up(tmp_path)
    try:
        running.start_demo()
        yield running
    finally:
        running.stop()


def readme_tour(mesh: Up) -> Iterator[tuple[str, subprocess.CompletedProcess[str]]]:
    """Run each command of the README's "A short tour" block as written (the mesh's state
    directory by TRELLIS_STATE_DIR, `<CN>` a connected proxy's): (line, its result)."""
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## A short tour", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    proxies = json.loads(mesh.cli("proxy", "list", "--json").stdout)["proxies"]
    common_name = next(p["proxy"] for p in proxies if ".bookbuyer." in p["proxy"])
    lines = [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]
    assert len(lines) >= 10, lines
    for line in lines:
        argv = shlex.split(line.replace("<CN>", common_name))
        assert argv[0] == ".venv/bin/trellis", line  # what works right after `make run`
        done = subprocess.run(
            [str(ROOT / argv[0]), *argv[1:]],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
            env={**os.environ, "TRELLIS_STATE_DIR": str(mesh.state)},
        )
        yield line, done


def test_the_bookstore_demo_end_to_end(mesh: Up) -> None:
    # the split, as bookbuyer sees it
    wait(
        lambda: {"bookstore-v1", "bookstore-v2"} <= set(mesh.counts("bookbuyer")),
        60,
        "bookbuyer reaches both versions",
    )
    seen = mesh.window("bookbuyer", 300)
    assert set(seen) == {"bookstore-v1", "bookstore-v2"}, seen
    assert 0.1 <= share(seen, "bookstore-v2") <= 0.3, seen  # 80/20
    thief = mesh.window("bookthief", 50)
    assert set(thief) == {"denied"}, thief
    # the dashboard `trellis up` serves shows these edges live, in headless Chromium
    check_dashboard(dashboard_url(mesh.output()))

    status = mesh.cli("status", "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    reported = json.loads(status.stdout)
    # 4 sidecars, the greeters' two and the Gateway's Envoy, on either replica
    assert reported["mesh"]["connected_proxies"] == 7
    # bookstore through the demo's Gateway, over mesh mTLS as the gateway's identity
    through_gateway = httpx.get(demo.gateway_url(), timeout=5)
    assert through_gateway.status_code == 200, through_gateway.text
    assert through_gateway.json()["app"] in ("bookstore-v1", "bookstore-v2")
    healthy = {s["service"]: s["healthy"] for s in reported["services"]}
    assert healthy["proxy-cp"] is healthy["proxy-cp-2"] is True, healthy

    # the README's proxyless gRPC client, against the demo's greeters
    client = mesh.spec.parent / "client-grpc"
    onboarded = mesh.cli(
        "grpc", "bootstrap", "-n", "shop", "--service", "client", "--out", str(client)
    )
    assert onboarded.returncode == 0, onboarded.stderr
    called = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "grpc" / "greeter.py"), "call",
         "xds:///hello.shop:9000", "100"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "GRPC_XDS_BOOTSTRAP": str(client / "bootstrap.json")},
    )  # fmt: skip
    assert called.returncode == 0, called.stderr
    greeted = ast.literal_eval(called.stdout.strip())
    assert set(greeted) == {"hello-v1", "hello-v2"}, greeted  # 80/20
    assert greeted["hello-v1"] > greeted["hello-v2"], greeted
    assert (
        mesh.cli(
            "policy", "check", "--from", "bookthief/bookthief", "--to", "bookstore/bookstore"
        ).returncode
        == 1
    )

    # weights edited live
    split = mesh.spec / "bookstore" / "traffic-split.yaml"
    split.write_text(
        split.read_text().replace("weight: 80", "weight: 50").replace("weight: 20", "weight: 50")
    )
    wait(
        lambda: 0.35 <= share(mesh.window("bookbuyer", 200), "bookstore-v2") <= 0.65,
        60,
        "the split follows the edit to 50/50",
    )

    # a workload deregistered: traffic leaves it, nothing fails
    gone = mesh.cli("vm", "deregister", "-n", "bookstore", "--name", "bookstore-v2-demo")
    assert gone.returncode == 0, gone.stderr
    wait(
        lambda: set(mesh.window("bookbuyer", 100)) == {"bookstore-v1"},
        60,
        "traffic leaves the deregistered workload",
    )
    back = mesh.cli(
        "vm",
        "register",
        "-n",
        "bookstore",
        "--name",
        "bookstore-v2-demo",
        "--service",
        "bookstore-v2",
        "--address",
        "127.0.0.1",
        "--port",
        "http=15123",
        "--service-account",
        "bookstore",
    )
    assert back.returncode == 0, back.stderr
    wait(lambda: "bookstore-v2" in mesh.window("bookbuyer", 100), 60, "v2 is back")

    # every service killed in turn while traffic flows: the data plane keeps serving
    root = mesh.cli("certs", "root", "--json")
    for service in SERVICES:
        pid = mesh.pid(service)
        os.kill(pid, signal.SIGKILL)
        during = mesh.window("bookbuyer", 80)
        ok = during["bookstore-v1"] + during["bookstore-v2"]
        assert ok >= 0.95 * sum(during.values()), (service, during)

        def restarted(s: str = service, old: int = pid) -> bool:
            return mesh.pid(s) != old and mesh.ready(s)

        wait(restarted, 90, f"{service} restarted")

    # Redis restarted: nothing lost
    # redis-server rewrites its process title to "redis-server 127.0.0.1:16379"
    redis = subprocess.run(
        ["pgrep", "-f", "redis-server 127.0.0.1:16379"], capture_output=True, text=True, check=False
    ).stdout.split()
    assert redis, "the private Redis runs"
    os.kill(int(redis[0]), signal.SIGKILL)
    during = mesh.window("bookbuyer", 80)
    assert during["bookstore-v1"] + during["bookstore-v2"] >= 0.95 * sum(during.values()), during
    wait(lambda: all(mesh.ready(s) for s in SERVICES), 90, "services ready after Redis restart")
    assert (
        json.loads(mesh.cli("certs", "root", "--json").stdout)["fingerprint_sha256"]
        == (json.loads(root.stdout)["fingerprint_sha256"])
    )
    workloads = json.loads(mesh.cli("vm", "list", "--json").stdout)["workloads"]
    assert {w["name"] for w in workloads} == {
        "bookstore-v1-demo", "bookstore-v2-demo", "hello-v1-demo", "hello-v2-demo"
    }  # fmt: skip

    # converged: the mesh still follows the documents
    split.write_text(
        split.read_text()
        .replace("weight: 50\n  - service: bookstore-v2", "weight: 100\n  - service: bookstore-v2")
        .replace("weight: 50", "weight: 0")
    )
    wait(
        lambda: set(mesh.window("bookbuyer", 100)) == {"bookstore-v1"},
        60,
        "a last edit (100/0) takes effect after all the restarts",
    )

    # the README's tour, as written (a command that does not exist, or fails, fails here)
    for line, done in readme_tour(mesh):
        denied = " policy check " in line  # the tour's example is a denial: exit 1
        assert done.returncode == (1 if denied else 0), (line, done.stdout, done.stderr)

    # a clean stop: every process of the mesh ends
    pids = [mesh.pid(s) for s in SERVICES]
    assert mesh.process is not None
    mesh.process.send_signal(signal.SIGTERM)
    assert mesh.process.wait(90) == 0
    wait(lambda: not any(alive(p) for p in pids), 10, "no process is left behind")
