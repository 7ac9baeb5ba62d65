"""``trellis dashboard`` in a cluster: the injected pods, read through port-forwards.

The pods are what the injector's own patch makes of a plain pod (so discovery cannot drift
from injection), stored in the test API server, whose ``portforward`` subresource
(``kubeportforward``) sends one pod's admin port to a real Envoy on this machine; the CLI
runs as a user runs it, with only a kubeconfig.
"""

from __future__ import annotations

import base64
import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
from click.testing import CliRunner
from kubernetes import client

from trellis_cli import cluster as cluster_module
from trellis_cli import dashpods
from trellis_cli.main import cli
from trellis_cli.meshedges import DENIED
from trellis_injector.domain import injection
from trellis_injector.domain.onboarding import ControlPlane, XdsEndpoint, build_bootstrap
from trellis_kube import injection as kube_injection
from trellis_testing import kubeportforward
from trellis_testing.identities import LocalCA
from trellis_testing.kube import KubeApi
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually

#: Not Envoy's default: the dashboard must read the port from the pod's bootstrap.
ADMIN_PORT = 15500


def injected(name: str, namespace: str = "shop", annotations: dict[str, str] | None = None) -> Any:
    """A plain pod of ``client``, patched as the injector's webhook patches it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "client"},
            "annotations": annotations or {},
        },
        "spec": {"containers": [{"name": "app", "image": "client:1"}]},
    }
    sidecar = injection.Sidecar("envoy:1", "init:1", "agent:1", admin_port=ADMIN_PORT)
    request = injection.proxy_request(pod, namespace, sidecar)
    control = ControlPlane(XdsEndpoint("proxy-cp.trellis-system", 15128), "spiffe://x/proxy-cp")
    agent = injection.Agent(
        address="proxy-cp.trellis-system:15129",
        server_name="proxy-cp.trellis-system.svc",
        ca_pem="",
        service=request.service,
        bootstrap=build_bootstrap(request, "enrolling", control),
    )
    patch = injection.pod_patch(pod, sidecar, agent, kube_injection.Exclusions())
    return jsonpatch.apply_patch(copy.deepcopy(pod), patch)


def test_injected_pods_are_found_with_the_admin_port_of_their_bootstrap() -> None:
    plain = {"metadata": {"name": "plain-0", "namespace": "shop"},
             "spec": {"containers": [{"name": "app"}]}, "status": {"phase": "Running"}}  # fmt: skip
    running = {**injected("client-0"), "status": {"phase": "Running"}}
    pending = {**injected("client-1"), "status": {"phase": "Pending"}}
    leaving = injected("client-2")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    found = dashpods.injected_pods({"items": [plain, pending, running, leaving]})
    assert found == [
        dashpods.InjectedPod("shop", "client-0", ADMIN_PORT, running=True),
        dashpods.InjectedPod("shop", "client-1", ADMIN_PORT, running=False),
    ]
    # a bootstrap that does not say: Envoy's default admin port
    bare = copy.deepcopy(running)
    for container in bare["spec"]["initContainers"]:
        container.pop("env", None)
    assert dashpods.admin_port(bare) == dashpods.DEFAULT_ADMIN_PORT


def test_pod_namespaces_are_refused_for_a_local_mesh(tmp_path: Path) -> None:
    (tmp_path / "services").mkdir()  # a local mesh: no cluster
    done = CliRunner().invoke(
        cli, ["--state-dir", str(tmp_path), "dashboard", "--no-open", "--pod-namespace", "shop"]
    )
    assert done.exit_code == 2, done.output
    assert "--pod-namespace applies in a cluster" in done.output


def _pod(core: Any, body: dict[str, Any], phase: str) -> None:
    namespace = body["metadata"]["namespace"]
    core.create_namespaced_pod(namespace, body)
    status = {"phase": phase, "podIP": "127.0.0.1"}
    core.patch_namespaced_pod_status(body["metadata"]["name"], namespace, {"status": status})


@pytest.fixture
def cluster(tmp_path: Path, kube: tuple[KubeApi, Any], sidecar: Any) -> Path:
    """Three injected pods: ``client-0`` forwarded to the real sidecar, ``broken-0`` whose
    admin port nothing listens on, ``pending-0`` not running; and the chart's CA Secret
    (the CLI reads the trust bundle from the cluster)."""
    api, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    bundle = base64.b64encode(LocalCA().bundle_pem).decode()
    secret = {"metadata": {"name": "trellis-ca", "namespace": "trellis-system"},
              "data": {"ca.crt": bundle}}  # fmt: skip
    core.create_namespaced_secret("trellis-system", secret)
    _pod(core, injected("client-0"), "Running")
    _pod(core, injected("broken-0"), "Running")
    _pod(core, injected("pending-0"), "Pending")
    plain = {"metadata": {"name": "plain-0", "namespace": "shop"},
             "spec": {"containers": [{"name": "app", "image": "app:1"}]}}  # fmt: skip
    _pod(core, plain, "Running")
    to = ("127.0.0.1", int(sidecar.envoy.admin_port))
    kubeportforward.forward(api.server, "shop", "client-0", ADMIN_PORT, to)
    return api.write_kubeconfig(tmp_path / "kubeconfig")


class Dashboard:
    """``trellis dashboard`` run as a user runs it, with only a kubeconfig."""

    def __init__(self, kubeconfig: Path, scratch: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/api/mesh"
        env = {
            k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TRELLIS_ADMIN_TOKEN")
        }
        env["HOME"] = str(scratch)
        argv = [
            sys.executable, "-m", "trellis_cli.main", "--kubeconfig", str(kubeconfig),
            "--state-dir", str(scratch / "no-local-mesh"), "dashboard", "--no-open",
            "--port", str(port), "--interval", "0.5", "--max-forwards", "2",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stderr: str | None = None

    def stop(self) -> str:
        """Stop it (once); what it wrote to the terminal."""
        if self.stderr is None:
            self.process.terminate()
            self.stderr = self.process.communicate(timeout=20)[1]
        return self.stderr


@pytest.fixture
def dashboard(tmp_path: Path, cluster: Path) -> Iterator[Dashboard]:
    running = Dashboard(cluster, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def _picture(url: str) -> Any:
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return answer.json() if answer.status_code == 200 else None


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_the_injected_pods_sidecars_are_read_through_port_forwards(
    sidecar: Any, dashboard: Dashboard
) -> None:
    sidecar.send(routed=10, unrouted=4)

    def read_twice() -> Any:
        picture = _picture(dashboard.url)
        edges = {(e["source"], e["destination"]): e for e in (picture or {}).get("edges", [])}
        web = edges.get(("shop/client", "shop/web"))
        return picture if web and web["rps"] is not None else None  # a rate: two reads

    picture = await eventually(read_twice, timeout=60, message="no edge from the pod's sidecar")
    edges = {(e["source"], e["destination"]): e for e in picture["edges"]}
    assert edges[("shop/client", "shop/web")]["requests"] == 10
    assert edges[("shop/client", DENIED)]["requests"] == 4
    assert picture["source"]["kind"] == "cluster"
    assert picture["source"]["injected_pods"] == 3
    assert picture["source"]["not_running"] == 1
    assert picture["source"]["read"] == 1
    assert picture["source"]["unreachable"] == ["shop/broken-0"]
    [broken] = [e for e in picture["errors"] if e.startswith("pod shop/broken-0:")]
    assert f"admin port {ADMIN_PORT} is not reachable through a port-forward" in broken
    client_node = next(s for s in picture["services"] if s["id"] == "shop/client")
    assert client_node["sidecars"] == 1
    # the catalog has no pod here: the page says so, and still draws the traffic
    assert any(e.startswith("catalog: ") for e in picture["errors"]), picture["errors"]
    terminal = dashboard.stop()
    assert "reading the injected pods' sidecars through port-forwards" in terminal
    assert (
        "1 of 2 injected pods could not be reached through a port-forward: shop/broken-0"
        in terminal
    ), terminal
    assert "Traceback" not in terminal


class _Counting(ThreadingHTTPServer):
    """The sidecar's admin API as the pods' port-forwards reach it: an HTTP relay that counts
    the requests in flight at once, and holds each a moment, so that unbounded reads would
    overlap.

    A port-forward carries one connection, and the CLI's client sends one request on it at a
    time, so requests in flight at once are port-forwards in use at once. They are counted
    only while the CLI cannot have gone on: from a request (it reached here, so the CLI sent
    it) until just before its answer is written (the CLI waits for that answer). Counting
    connections instead raced: a forward the CLI is done with is closed here later (its
    close crosses the API server), so it could still count when the next one opens."""

    daemon_threads = True

    def __init__(self, to: tuple[str, int]) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.upstream = httpx.Client(base_url=f"http://{to[0]}:{to[1]}", timeout=10)
        self.open, self.peak = 0, 0
        self.port = int(self.server_address[1])
        self.lock = threading.Lock()

    def server_close(self) -> None:
        super().server_close()
        self.upstream.close()


class _Relay(BaseHTTPRequestHandler):
    server: _Counting
    protocol_version = "HTTP/1.1"  # kept alive: one connection per forward, as the CLI's

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.open += 1
            self.server.peak = max(self.server.peak, self.server.open)
        try:
            # each request is held a while, so that reads the CLI made at once would overlap
            # here and show in the peak: a hold that makes concurrency visible, not a wait
            # for an event
            time.sleep(0.2)
            answer = self.server.upstream.get(self.path)
        finally:
            with self.server.lock:  # before the answer: after it, the CLI may go on
                self.server.open -= 1
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "text/plain"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    def log_message(self, format: str, *args: Any) -> None:  # the base class names it so
        """Quiet: the test's output is its assertions."""


@pytest.mark.slow
def test_no_more_pods_than_max_forwards_are_forwarded_to_at_once(
    tmp_path: Path, kube: tuple[KubeApi, Any], sidecar: Any
) -> None:
    api, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    relay = _Counting(("127.0.0.1", int(sidecar.envoy.admin_port)))
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    names = [f"client-{n}" for n in range(6)]
    for name in names:
        _pod(core, injected(name), "Running")
        kubeportforward.forward(api.server, "shop", name, ADMIN_PORT, ("127.0.0.1", relay.port))
    target = cluster_module.Target(api.write_kubeconfig(tmp_path / "kc"), None, "trellis-system")
    reached = cluster_module.Cluster(target)
    try:
        reading = dashpods.ClusterSidecars(reached, ("shop",), max_forwards=2).read()
    finally:
        reached.close()
        relay.shutdown()
        relay.server_close()
    assert reading.errors == []
    assert sorted(s.sidecar for s in reading.samples) == [f"shop/{n}" for n in names]
    assert 1 <= relay.peak <= 2, f"{relay.peak} requests at once through port-forwards"
