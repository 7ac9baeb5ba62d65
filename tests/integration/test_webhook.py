"""An injected pod's agent enrolls its proxy with the pod's token; its Envoy joins the mesh.

Everything but the cluster is real: Redis, certmanager (reviewing tokens with the test API
server, :mod:`trellis_common.testing.kube`), the catalog, proxy-cp and the injector as
processes, an AdmissionReview posted over TLS as the API server posts it, the agent
(``trellis_cli.agent``) as a process, and Envoy 1.40. The kubelet's part is played by the
test: it stores the patched pod, issues the pod-bound projected token the ``trellis-token``
volume asks for, starts the agent with its container's environment (its folder is the
injector's ``proxy_mount_path``, pointed here), waits for the startup probe's file, then
starts Envoy with the ``envoy`` container's arguments. (``tests/netns`` runs all of it in
real pods.)
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
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
from cryptography import x509
from kubernetes import client, config

from trellis_common import adminhttp, components
from trellis_common.kube import injection
from trellis_common.testing import RedisServer, eventually
from trellis_common.testing.admission import pod_review
from trellis_common.testing.envoy import find_envoy
from trellis_common.testing.kube import KubeApi
from trellis_common.testing.ports import free_port
from trellis_common.testing.services import ServiceProcess, start_mesh, stop_together

pytestmark = pytest.mark.integration

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

    def start(self) -> None:
        start_mesh(self.processes.values())

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


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    with KubeApi() as api:
        yield api


@pytest.fixture
def extra_env() -> dict[str, dict[str, str]]:
    """Settings of one process or another, per test (see the renewal test)."""
    return {}


@pytest.fixture
def mesh(
    tmp_path: Path,
    state_dir: Path,
    redis_server: RedisServer,
    kube: KubeApi,
    extra_env: dict[str, dict[str, str]],
) -> Iterator[Mesh]:
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube.write_kubeconfig(tmp_path / "setup-kubeconfig"))
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
    mesh = Mesh(tmp_path, state_dir, redis_server, kube, extra_env)
    try:
        mesh.start()
        yield mesh
    finally:
        mesh.stop()


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
        return httpx.get(f"http://127.0.0.1:{self.mesh.ports['admin']}{path}", timeout=5)

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


def test_an_injected_pods_agent_enrolls_and_its_envoy_joins_the_mesh(
    mesh: Mesh, kube: KubeApi, tmp_path: Path
) -> None:
    # the caBundle the API server checks the webhook with is the mesh's trust bundle
    trust_bundle = (mesh.state_dir / "trust-bundle.pem").read_bytes()

    def ca_bundles() -> list[str]:
        [stored] = kube.objects("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
        return [h["clientConfig"].get("caBundle", "") for h in stored["webhooks"]]

    asyncio.run(
        eventually(lambda: ca_bundles() == [base64.b64encode(trust_bundle).decode()], timeout=10)
    )
    pod = injected(mesh)
    init = pod["spec"]["initContainers"][0]  # MeshConfig's exclusion list
    assert "-A TRELLIS_OUTPUT -p tcp --dport 5432 -j RETURN" in init["command"][2]
    assert kube.objects("", "secrets") == []  # the webhook stores nothing
    kubelet = Kubelet(mesh, kube, tmp_path, pod)
    try:
        kubelet.start_agent()
        files = {p.name: p for p in mesh.mount.iterdir()}
        assert {"envoy.yaml", "key.pem", "cert.pem", "workload.pem", "ca.pem"} <= set(files)
        assert files["key.pem"].stat().st_mode & 0o077 == 0  # the key: the proxy's uid only
        proxy = x509.load_pem_x509_certificate(files["cert.pem"].read_bytes())
        common_name = str(proxy.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)
        assert common_name == f"{kubelet.uid}.bookbuyer.bookbuyer"  # the token's pod uid
        workload = x509.load_pem_x509_certificate(files["workload.pem"].read_bytes())
        sans = workload.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
        assert uris == ["spiffe://cluster.local/ns/bookbuyer/sa/bookbuyer"]
        assert workload.public_key() == proxy.public_key()  # one key, made in the pod
        proxies = {p["common_name"]: p for p in mesh.get("catalog", "/v1/proxies")["proxies"]}
        assert proxies[common_name]["expected"] is True
        assert proxies[common_name]["service_account"] == "bookbuyer"

        log = kubelet.start_envoy()
        wait_joined(kubelet, common_name, log)
        assert (
            "control_plane.connected_state: 1"
            in kubelet.admin("/stats?filter=control_plane.connected_state").text
        )
        # Envoy's xDS client certificate is the agent's, read from its folder
        assert f"{proxy.serial_number:x}" in served_serials(kubelet)
        assert kubelet.container("envoy")["args"][-2:] == ["--log-level", "debug"]
        assert "][debug][" in log.read_text()  # Envoy runs at MeshConfig's level
    finally:
        kubelet.stop()
    for name in ("injector", "proxy-cp", "certmanager"):
        assert "PRIVATE KEY" not in mesh.processes[name].logs()
        assert kubelet.token.read_text() not in mesh.processes[name].logs()
    metrics = mesh.processes["injector"].get("/metrics").text
    assert 'trellis_injector_admissions_total{outcome="injected"} 1.0' in metrics
    metrics = mesh.processes["proxy-cp"].get("/metrics").text
    assert 'trellis_proxy_cp_enrollments_total{outcome="enrolled"} 1.0' in metrics


def test_opt_out_unmonitored_malformed_and_catalog_down(mesh: Mesh, kube: KubeApi) -> None:
    # a review for a namespace the mesh does not monitor (forged: the API server's
    # namespaceSelector would not send it) is left alone
    elsewhere = mesh.post_review(pod_review(BOOKBUYER, "kube-system")).json()["response"]
    assert elsewhere["allowed"] is True
    assert "patch" not in elsewhere

    opted_out = json.loads(json.dumps(BOOKBUYER))
    opted_out["metadata"]["annotations"] = {injection.INJECTION_ANNOTATION: "disabled"}
    response = mesh.post_review(review_of(opted_out)).json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response

    malformed = mesh.post_review(b'{"apiVersion": "admission.k8s.io/v1"}')
    assert malformed.status_code == 400
    assert "AdmissionReview" in malformed.json()["error"]

    mesh.processes["catalog"].stop()
    response = mesh.post_review(review_of(BOOKBUYER), query="?timeout=5s").json()["response"]
    assert response["allowed"] is False  # failure policy Fail
    assert "catalog" in response["status"]["message"]


@pytest.mark.parametrize(
    "extra_env",
    [
        # proxy certificates of 120 s (180 s with the minute certmanager backdates them
        # by); the agent renews at 0.36 of that: about 5 s after each enrollment
        {"certmanager": {"TRELLIS_CERTMANAGER_PROXY_CERT_VALIDITY": "PT120S"}},
    ],
)
def test_the_agent_renews_key_and_certificates_and_envoy_follows(
    mesh: Mesh, kube: KubeApi, tmp_path: Path
) -> None:
    kubelet = Kubelet(mesh, kube, tmp_path, injected(mesh))
    try:
        kubelet.start_agent(TRELLIS_AGENT_RENEW_FRACTION="0.36")
        key = mesh.mount / "key.pem"
        first_key = key.read_bytes()
        first = x509.load_pem_x509_certificate((mesh.mount / "cert.pem").read_bytes())
        common_name = str(first.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value)
        log = kubelet.start_envoy()
        wait_joined(kubelet, common_name, log)
        asyncio.run(
            eventually(lambda: key.read_bytes() != first_key, timeout=30, message="renewed")
        )
        renewed = x509.load_pem_x509_certificate((mesh.mount / "cert.pem").read_bytes())
        workload = x509.load_pem_x509_certificate((mesh.mount / "workload.pem").read_bytes())
        assert renewed.subject == first.subject  # the same proxy, a new key
        assert renewed.serial_number != first.serial_number
        assert workload.public_key() == renewed.public_key()
        revoked = mesh.get("certmanager", f"/v1/revoked?common_name={common_name}")["revoked"]
        assert f"{first.serial_number:x}" in {r["serial"] for r in revoked}
        # Envoy reloads the swapped folder: it presents the new proxy certificate, and its
        # xDS stream (ended with the revoked certificate) comes back with the new one
        asyncio.run(eventually(
            lambda: f"{renewed.serial_number:x}" in served_serials(kubelet),
            timeout=20, message="Envoy loads the renewed proxy certificate",
        ))  # fmt: skip
        assert f"{first.serial_number:x}" not in served_serials(kubelet)
        wait_joined(kubelet, common_name, log)
    finally:
        kubelet.stop()


def test_enrollment_refuses_what_the_token_does_not_prove(
    mesh: Mesh, kube: KubeApi, tmp_path: Path
) -> None:
    from trellis_cli.agent import AgentConfig, AgentError, enroll

    kubelet = Kubelet(mesh, kube, tmp_path, injected(mesh))
    agent = {e["name"]: e["value"] for e in kubelet.container("trellis-agent")["env"]}

    def attempt(token: str) -> str:
        path = tmp_path / "attempt-token"
        path.write_text(token)
        config = AgentConfig.from_env({**agent, "TRELLIS_AGENT_TOKEN": str(path)})
        with pytest.raises(AgentError) as refused:
            enroll(config)
        return str(refused.value)

    unbound = kube.service_account_token("bookbuyer", "bookbuyer")
    assert "not_bound" in attempt(unbound)
    wrong = kube.service_account_token(
        "bookbuyer", "bookbuyer", audiences=("other",), pod=("bookbuyer-1", kubelet.uid)
    )
    assert "wrong_audience" in attempt(wrong)
    system = kube.service_account_token("trellis-system", "proxy-cp", pod=("p", kubelet.uid))
    refused = attempt(system)
    assert "not_authenticated" in refused or "control_plane_namespace" in refused
    assert "UNAUTHENTICATED" in attempt("")
    kubelet.core.delete_namespaced_pod("bookbuyer-1", "bookbuyer")  # its token dies with it
    assert "not_authenticated" in attempt(kubelet.token.read_text())

    metrics = mesh.processes["proxy-cp"].get("/metrics").text
    for reason in ("not_bound", "wrong_audience", "no_token", "not_authenticated"):
        assert f'trellis_proxy_cp_enrollments_total{{outcome="{reason}"}}' in metrics, [
            line for line in metrics.splitlines() if "enrollments" in line
        ]
    assert "enroll.refused" in mesh.processes["certmanager"].logs()
    assert 'trellis_proxy_cp_enrollments_total{outcome="enrolled"}' not in metrics
