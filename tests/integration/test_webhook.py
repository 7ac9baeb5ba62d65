"""An injected pod's proxy, started from what the webhook made, joins the mesh.

Everything but the cluster is real: Redis, certmanager, the catalog, proxy-cp and the
injector as processes, the injector writing to the test API server
(:mod:`trellis_common.testing.kube`) through a kubeconfig, an AdmissionReview posted over
TLS as the API server posts it, and Envoy 1.40. The kubelet's part is played by the test:
it writes the Secret's files into the directory the pod would mount them at (the
injector's ``proxy_mount_path`` points there, so the bootstrap is used as it was made) and
starts Envoy with the ``envoy`` container's arguments from the patched pod.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import shutil
import subprocess
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
                "certmanager", "trellis_certmanager.main", **extra.get("certmanager", {})
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
                    "sideEffects": "NoneOnDryRun",
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


def test_an_injected_pods_envoy_joins_the_mesh(mesh: Mesh, kube: KubeApi, tmp_path: Path) -> None:
    # the caBundle the API server checks the webhook with is the mesh's trust bundle
    trust_bundle = (mesh.state_dir / "trust-bundle.pem").read_bytes()

    def ca_bundles() -> list[str]:
        [stored] = kube.objects("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
        return [h["clientConfig"].get("caBundle", "") for h in stored["webhooks"]]

    asyncio.run(
        eventually(lambda: ca_bundles() == [base64.b64encode(trust_bundle).decode()], timeout=10)
    )

    body = review_of(BOOKBUYER)
    answer = mesh.post_review(body)
    assert answer.status_code == 200, answer.text
    response = answer.json()["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True, response
    pod = jsonpatch.apply_patch(BOOKBUYER, json.loads(base64.b64decode(response["patch"])))
    [init] = pod["spec"]["initContainers"]  # MeshConfig's exclusion list
    assert "-A TRELLIS_OUTPUT -p tcp --dport 5432 -j RETURN" in init["command"][2]
    proxy_id = pod["metadata"]["labels"][injection.PROXY_UUID_LABEL]
    common_name = f"{proxy_id}.bookbuyer.bookbuyer"

    # the Secret, in the pod's namespace, named in the pod's volume
    [volume] = [v for v in pod["spec"]["volumes"] if "secret" in v]
    [stored] = [s for s in kube.objects("", "secrets") if s["metadata"]["namespace"] == "bookbuyer"]
    assert stored["metadata"]["name"] == volume["secret"]["secretName"]
    assert "PRIVATE KEY" not in mesh.processes["injector"].logs()

    # the catalog expects the proxy before it connects
    proxies = {p["common_name"]: p for p in mesh.get("catalog", "/v1/proxies")["proxies"]}
    assert proxies[common_name]["expected"] is True
    assert proxies[common_name]["service_account"] == "bookbuyer"

    # the kubelet's part: the Secret's files at the mount path, then the envoy container
    mesh.mount.mkdir(parents=True)
    for name, data in stored["data"].items():
        (mesh.mount / name).write_bytes(base64.b64decode(data))
    [envoy_container] = [c for c in pod["spec"]["containers"] if c["name"] == "envoy"]
    log = tmp_path / "envoy.log"
    with log.open("wb") as sink:
        envoy = subprocess.Popen(
            [
                find_envoy(),
                *envoy_container["args"],
                "--base-id",
                str(random.randrange(1000, 60000)),
                "--concurrency",
                "1",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:

        def connected() -> bool:
            listed = mesh.get("proxy-cp", "/v1/proxies")["proxies"]
            return any(p["proxy"] == common_name for p in listed)

        def configured() -> bool:
            stats = httpx.get(
                f"http://127.0.0.1:{mesh.ports['admin']}/stats?filter=lds.update_success",
                timeout=5,
            ).text
            return (
                "listener_manager.lds.update_success: 0" not in stats and "update_success" in stats
            )

        try:
            asyncio.run(
                eventually(connected, timeout=20, interval=0.2, message="proxy-cp lists it")
            )
            asyncio.run(eventually(configured, timeout=20, interval=0.2, message="Envoy has LDS"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; envoy's log:\n{log.read_text()[-4000:]}") from None
        stats = httpx.get(
            f"http://127.0.0.1:{mesh.ports['admin']}/stats?filter=control_plane.connected_state",
            timeout=5,
        )
        assert "control_plane.connected_state: 1" in stats.text
        assert envoy_container["args"][-2:] == ["--log-level", "debug"]
        assert "][debug][" in log.read_text()  # Envoy runs at MeshConfig's level
    finally:
        envoy.terminate()
        try:
            envoy.wait(10)
        except subprocess.TimeoutExpired:
            envoy.kill()
            envoy.wait()

    metrics = mesh.processes["injector"].get("/metrics").text
    assert 'trellis_injector_admissions_total{outcome="injected"} 1.0' in metrics
    assert 'trellis_injector_proxy_secrets_total{outcome="created"} 1.0' in metrics


def test_opt_out_malformed_and_certmanager_down(mesh: Mesh, kube: KubeApi) -> None:
    opted_out = json.loads(json.dumps(BOOKBUYER))
    opted_out["metadata"]["annotations"] = {injection.INJECTION_ANNOTATION: "disabled"}
    response = mesh.post_review(review_of(opted_out)).json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response

    malformed = mesh.post_review(b'{"apiVersion": "admission.k8s.io/v1"}')
    assert malformed.status_code == 400
    assert "AdmissionReview" in malformed.json()["error"]

    mesh.processes["certmanager"].stop()
    response = mesh.post_review(review_of(BOOKBUYER), query="?timeout=5s").json()["response"]
    assert response["allowed"] is False  # failure policy Fail
    assert "certmanager" in response["status"]["message"]
    assert kube.objects("", "secrets") == []


@pytest.mark.parametrize(
    "extra_env",
    [
        {
            # proxy certificates of 120 s (180 s with the minute certmanager backdates
            # them by), due 0.35 into that: 3 s after issue; sweeps twice a second
            "certmanager": {"TRELLIS_CERTMANAGER_PROXY_CERT_VALIDITY": "PT120S"},
            "injector": {
                "TRELLIS_INJECTOR_SECRET_RENEW_FRACTION": "0.35",
                "TRELLIS_INJECTOR_SECRET_UPKEEP_INTERVAL": "0.5",
                # long enough for the pod's creation to reach the injector's informer on a
                # loaded machine (at 3 s the Secret was once taken for an orphan first)
                "TRELLIS_INJECTOR_ORPHAN_SECRET_GRACE": "15",
            },
        }
    ],
)
def test_an_injected_proxys_secret_is_renewed_and_deleted_with_its_pod(
    mesh: Mesh, kube: KubeApi, tmp_path: Path
) -> None:
    answer = mesh.post_review(review_of(BOOKBUYER))
    response = answer.json()["response"]
    assert response["allowed"] is True, response
    pod = jsonpatch.apply_patch(BOOKBUYER, json.loads(base64.b64decode(response["patch"])))
    proxy_id = pod["metadata"]["labels"][injection.PROXY_UUID_LABEL]
    common_name = f"{proxy_id}.bookbuyer.bookbuyer"
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube.write_kubeconfig(tmp_path / "test-kubeconfig"))
    )
    core: Any = client.CoreV1Api(api_client)
    core.create_namespaced_pod("bookbuyer", {**pod, "metadata": {**pod["metadata"], "name": "b"}})

    def secret() -> dict[str, Any] | None:
        found = [
            s for s in kube.objects("", "secrets") if s["metadata"]["namespace"] == "bookbuyer"
        ]
        return found[0] if found else None

    def pem(name: str) -> bytes:
        stored = secret()
        assert stored is not None
        return base64.b64decode(stored["data"][name])

    first_cert, first_key = pem("cert.pem"), pem("key.pem")
    first = x509.load_pem_x509_certificate(first_cert)
    asyncio.run(eventually(lambda: pem("cert.pem") != first_cert, timeout=30, message="renewed"))
    renewed = x509.load_pem_x509_certificate(pem("cert.pem"))
    assert renewed.subject == first.subject  # the same proxy
    assert renewed.serial_number != first.serial_number
    assert pem("key.pem") != first_key  # a new key with it, in the same patch
    revoked = mesh.get("certmanager", f"/v1/revoked?common_name={common_name}")["revoked"]
    assert f"{first.serial_number:x}" in {r["serial"] for r in revoked}
    metrics = mesh.processes["injector"].get("/metrics").text
    assert 'trellis_injector_proxy_secret_upkeep_total{outcome="renewed"}' in metrics
    assert "PRIVATE KEY" not in mesh.processes["injector"].logs()

    # the pod goes: its Secret is an orphan, and is deleted
    core.delete_namespaced_pod("b", "bookbuyer")
    asyncio.run(eventually(lambda: secret() is None, timeout=30, message="orphan deleted"))
    api_client.close()
