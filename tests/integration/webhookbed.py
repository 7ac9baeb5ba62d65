"""The pieces of ``test_webhook.py``'s bed: the control plane as processes on the test API
server (:class:`Mesh`, :func:`running_mesh`), and the kubelet's part for one injected pod
(:class:`Kubelet`): the pod stored, its bound token issued, the agent and Envoy started as
the patched containers say.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
from kubernetes import client, config

from trellis_common import components
from trellis_identity.trustctx import system_context
from trellis_kube import injection
from trellis_runtime import adminhttp
from trellis_testing import RedisServer, eventually, redis_backend
from trellis_testing.admission import pod_review
from trellis_testing.envoy import find_envoy
from trellis_testing.kube import KubeApi
from trellis_testing.ports import free_port
from trellis_testing.services import ServiceProcess, start_mesh, stop_together

pytestmark = pytest.mark.integration
#: The mesh and API server the tests in this group share (the renewal test has its own).

ROOT = Path(__file__).resolve().parents[2]
FAST = {"TRELLIS_REGISTRY_TTL": "2"}
MONITORED = {"trellis.dev/monitored-by": "trellis"}


class Mesh:
    def __init__(
        self,
        tmp: Path,
        state_dir: Path,
        redis: RedisServer,
        kube: KubeApi,
        extra: dict[str, dict[str, str]] | None = None,
    ) -> None:
        extra = extra or {}
        spec_dir = tmp / "spec"
        shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
        # MeshConfig's sidecar settings, which the injector takes from the catalog
        config = spec_dir / "meshconfig.yaml"
        config.write_text(
            config.read_text().replace(
                "    enableEgress: false\n",
                "    enableEgress: false\n    outboundPortExclusionList: [5432]\n"
                "  sidecar: {logLevel: debug}\n",
            )
        )
        self.state_dir = state_dir
        self.mount = tmp / "pod" / "etc" / "trellis" / "proxy"  # the pod's mount, here
        self.ports = {"inbound": free_port(), "outbound": free_port(), "admin": free_port()}
        kubeconfig = kube.write_kubeconfig(tmp / "kubeconfig")

        def process(name: str, module: str, *args: str, **env: str) -> ServiceProcess:
            return ServiceProcess(name, module, state_dir, redis, args=args, env={**FAST, **env})

        self.processes = {
            "certmanager": process(
                "certmanager",
                "trellis_certmanager.main",
                TRELLIS_CERTMANAGER_KUBECONFIG=str(kubeconfig),
                **extra.get("certmanager", {}),
            ),
            "catalog": process(
                "catalog",
                "trellis_catalog.main",
                "--spec-dir",
                str(spec_dir),
                TRELLIS_CATALOG_SPEC_POLL_INTERVAL="0.1",
                TRELLIS_CATALOG_DISCOVERY_INTERVAL="0.2",
            ),
            "proxy-cp": process("proxy-cp", "trellis_proxy_cp.main", "--xds-host", "127.0.0.1"),
            "injector": process(
                "injector",
                "trellis_injector.main",
                TRELLIS_INJECTOR_KUBECONFIG=str(kubeconfig),
                TRELLIS_INJECTOR_PROXY_MOUNT_PATH=str(self.mount),
                TRELLIS_INJECTOR_SIDECAR_INBOUND_PORT=str(self.ports["inbound"]),
                TRELLIS_INJECTOR_SIDECAR_OUTBOUND_PORT=str(self.ports["outbound"]),
                TRELLIS_INJECTOR_SIDECAR_ADMIN_PORT=str(self.ports["admin"]),
                **extra.get("injector", {}),
            ),
        }

    def start(self, timeout: float = 30.0) -> None:
        start_mesh(self.processes.values(), timeout)

    def stop(self) -> None:
        stop_together(reversed(list(self.processes.values())))

    def get(self, service: str, path: str) -> Any:
        return self.processes[service].get(path).json()

    def post_review(self, body: Any, query: str = "?timeout=10s") -> httpx.Response:
        """As the API server does: TLS, checked against the caBundle, to the Service name."""
        address = self.get("injector", "/v1/webhook")["address"]
        context = adminhttp.mesh_context(self.state_dir)
        with httpx.Client(verify=context, timeout=15) as http:
            return http.post(
                f"https://{address}/mutate{query}",
                content=body if isinstance(body, bytes) else json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
                extensions={"sni_hostname": components.server_name(components.INJECTOR)},
            )


@contextmanager
def running_mesh(
    tmp: Path, kube: KubeApi, extra_env: dict[str, dict[str, str]], timeout: float = 30.0
) -> Iterator[Mesh]:
    """The mesh's namespace and webhook configuration stored, then its Redis and services
    running (each ready within ``timeout``), with their state directory in ``tmp``."""
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube.write_kubeconfig(tmp / "setup-kubeconfig"))
    )
    core: Any = client.CoreV1Api(api_client)
    # the namespace the pods are made in is the mesh's (the injector checks it)
    core.create_namespace({"metadata": {"name": "bookbuyer", "labels": MONITORED}})
    admission: Any = client.AdmissionregistrationV1Api(api_client)
    admission.create_mutating_webhook_configuration(
        {
            "metadata": {"name": injection.WEBHOOK_CONFIGURATION},
            "webhooks": [
                {
                    "name": "pods.trellis.dev",
                    "clientConfig": {
                        "service": {
                            "name": "injector",
                            "namespace": "trellis-system",
                            "path": "/mutate",
                        }
                    },
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "namespaceSelector": {"matchLabels": {"trellis.dev/monitored-by": "trellis"}},
                }
            ],
        }
    )
    api_client.close()
    state_dir = tmp / "state"
    state_dir.mkdir()
    redis_server = redis_backend.redis_server(tmp / "redis")
    redis_server.start()
    try:
        mesh = Mesh(tmp, state_dir, redis_server, kube, extra_env)
        try:
            mesh.start(timeout)
            yield mesh
        finally:
            mesh.stop()
    finally:
        redis_server.close()


def review_of(pod: dict[str, Any]) -> dict[str, Any]:
    return pod_review(pod, "bookbuyer")


BOOKBUYER = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"generateName": "bookbuyer-5d4f7-", "labels": {"app": "bookbuyer"}},
    "spec": {
        "serviceAccountName": "bookbuyer",
        "containers": [{"name": "bookbuyer", "image": "openservicemesh/bookbuyer:v1.2.0"}],
    },
}


class Kubelet:
    """What the kubelet does for the patched pod, here: store it, write its token, run its
    agent and its Envoy as processes."""

    def __init__(self, mesh: Mesh, kube: KubeApi, tmp: Path, pod: dict[str, Any]) -> None:
        self.mesh, self.kube, self.tmp = mesh, kube, tmp
        api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(kube.write_kubeconfig(tmp / "kubelet-kubeconfig"))
        )
        self.core: Any = client.CoreV1Api(api_client)
        named = {**pod, "metadata": {**pod["metadata"], "name": "bookbuyer-1"}}
        create: Any = self.core.create_namespaced_pod
        created: Any = create("bookbuyer", named)
        self.pod, self.uid = named, str(created.metadata.uid)
        self.token = tmp / "token"
        self.token.write_text(kube.service_account_token(
            "bookbuyer", "bookbuyer", pod=("bookbuyer-1", self.uid)
        ))  # fmt: skip
        self.processes: list[subprocess.Popen[bytes]] = []

    def container(self, name: str) -> dict[str, Any]:
        every = [*self.pod["spec"]["containers"], *self.pod["spec"]["initContainers"]]
        found: dict[str, Any] = next(c for c in every if c["name"] == name)
        return found

    def start_agent(self, **env: str) -> Path:
        agent = self.container("trellis-agent")
        values = {e["name"]: e["value"] for e in agent["env"]}
        values["TRELLIS_AGENT_TOKEN"] = str(self.token)  # where the volume is, here
        log = self.tmp / "agent.log"
        with log.open("wb") as sink:
            self.processes.append(subprocess.Popen(
                [sys.executable, "-m", "trellis_cli.agent"],
                env={**os.environ, **values, **env},
                stdout=sink,
                stderr=subprocess.STDOUT,
            ))  # fmt: skip
        # the startup probe: the pod's containers start once the bootstrap is there
        bootstrap = Path(agent["startupProbe"]["exec"]["command"][-1])
        try:
            asyncio.run(eventually(lambda: bootstrap.exists(), timeout=30, message="enrolled"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the agent's log:\n{log.read_text()[-3000:]}") from None
        return log

    def start_envoy(self) -> Path:
        log = self.tmp / "envoy.log"
        with log.open("wb") as sink:
            self.processes.append(subprocess.Popen(
                [
                    find_envoy(), *self.container("envoy")["args"],
                    "--base-id", str(random.randrange(1000, 60000)), "--concurrency", "1",
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
            ))  # fmt: skip
        return log

    def admin(self, path: str) -> httpx.Response:
        return httpx.get(
            f"http://127.0.0.1:{self.mesh.ports['admin']}{path}", timeout=5, verify=system_context()
        )

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def injected(mesh: Mesh) -> dict[str, Any]:
    answer = mesh.post_review(review_of(BOOKBUYER))
    assert answer.status_code == 200, answer.text
    response = answer.json()["response"]
    assert response["allowed"] is True, response
    pod: dict[str, Any] = jsonpatch.apply_patch(
        BOOKBUYER, json.loads(base64.b64decode(response["patch"]))
    )
    return pod


def wait_joined(kubelet: Kubelet, common_name: str, log: Path) -> None:
    def connected() -> bool:
        listed = kubelet.mesh.get("proxy-cp", "/v1/proxies")["proxies"]
        return any(p["proxy"] == common_name for p in listed)

    def configured() -> bool:
        stats = kubelet.admin("/stats?filter=lds.update_success").text
        return "listener_manager.lds.update_success: 0" not in stats and "update_success" in stats

    try:
        asyncio.run(eventually(connected, timeout=20, interval=0.2, message="proxy-cp lists it"))
        asyncio.run(eventually(configured, timeout=20, interval=0.2, message="Envoy has LDS"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}; envoy's log:\n{log.read_text()[-4000:]}") from None


def served_serials(kubelet: Kubelet) -> set[str]:
    """The serials of the certificates Envoy has loaded (its admin ``/certs``)."""
    certs = kubelet.admin("/certs").json()["certificates"]
    return {
        cert["serial_number"].lower().lstrip("0")
        for entry in certs
        for cert in entry.get("cert_chain", [])
    }
