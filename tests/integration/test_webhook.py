"""An injected pod's agent enrolls its proxy with the pod's token; its Envoy joins the mesh.

Everything but the cluster is real: Redis, certmanager (reviewing tokens with the test API
server, :mod:`trellis_testing.kube`), the catalog, proxy-cp and the injector as
processes, an AdmissionReview posted over TLS as the API server posts it, the agent
(``trellis_cli.agent``) as a process, and Envoy 1.40. The kubelet's part is played by the
test: it stores the patched pod, issues the pod-bound projected token the ``trellis-token``
volume asks for, starts the agent with its container's environment (its folder is the
injector's ``proxy_mount_path``, pointed here), waits for the startup probe's file, then
starts Envoy with the ``envoy`` container's arguments. (``tests/netns`` runs all of it in
real pods.)

The mesh, its Redis and the API server start once for the module (the group
``webhook-mesh``: one xdist worker), not once per test: after each test, :func:`mesh` deletes
the pods the test stored, empties the pod's mount, starts a stopped service again, and waits
until the mesh is back at the baseline taken at start (:func:`snapshot`). Counts a test
reads are read before and after. The renewal test runs its own mesh: its certmanager issues
short-lived proxy certificates, a setting every other service's certificates hang on.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client, config

from tests.integration.webhookbed import (
    BOOKBUYER,
    Kubelet,
    Mesh,
    injected,
    review_of,
    running_mesh,
    served_serials,
    wait_joined,
)
from trellis_kube import injection
from trellis_testing import eventually
from trellis_testing.admission import pod_review
from trellis_testing.baseline import back_to, stored_names
from trellis_testing.kube import KubeApi
from trellis_testing.services import ServiceProcess

pytestmark = pytest.mark.integration
#: The mesh and API server the tests in this group share (the renewal test has its own).
SHARED = pytest.mark.xdist_group("webhook-mesh")
#: How long the shared mesh (or a service of it started again) may take to be ready (s).
START_TIMEOUT = 60.0

ROOT = Path(__file__).resolve().parents[2]
INJECTED = 'trellis_injector_admissions_total{outcome="injected"}'
ENROLLED = 'trellis_proxy_cp_enrollments_total{outcome="enrolled"}'


def refusals(outcome: str) -> str:
    """proxy-cp's count of enrollments that ended with ``outcome``."""
    return f'trellis_proxy_cp_enrollments_total{{outcome="{outcome}"}}'


def metric(process: ServiceProcess, sample: str) -> float:
    """The value of ``sample`` (a name with its labels) on ``/metrics``; 0 if absent."""
    for line in process.get("/metrics").text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def mesh_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared mesh's directory: spec documents, state, Redis, the pod's mount."""
    return tmp_path_factory.mktemp("webhook")


@pytest.fixture(scope="module")
def kube() -> Iterator[KubeApi]:
    """The shared mesh's API server."""
    with KubeApi() as api:
        yield api


#: What the mesh and the tests store in the cluster, by (group, plural).
STORED = (
    ("", "namespaces"),
    ("", "pods"),
    ("", "secrets"),
    ("admissionregistration.k8s.io", "mutatingwebhookconfigurations"),
)


def ca_bundles(kube: KubeApi) -> list[str]:
    [stored] = kube.objects("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
    return [h["clientConfig"].get("caBundle", "") for h in stored["webhooks"]]


def snapshot(mesh: Mesh, kube: KubeApi) -> dict[str, Any]:
    """What the tests read and change: the objects stored (by name) and the caBundle, the
    pod's mount, each service's readiness, loops and address, what the catalog lists and
    which proxies proxy-cp streams to."""
    ready = {name: p.get("/readyz").status_code for name, p in mesh.processes.items()}
    loops = {
        name: {loop["name"]: loop["up"] for loop in mesh.get(name, "/v1/status")["loops"]}
        for name in mesh.processes
    }
    return {
        "stored": stored_names(kube, STORED),
        "ca_bundles": ca_bundles(kube),
        "mount": sorted(p.name for p in mesh.mount.iterdir()) if mesh.mount.exists() else None,
        "ready": ready,
        "loops": loops,
        "addresses": {n: p.endpoint.grpc_address for n, p in mesh.processes.items()},
        "catalog": sorted(  # in the order loaded: a restarted catalog's may differ
            mesh.get("catalog", "/v1/services")["services"],
            key=lambda s: (s["namespace"], s["name"]),
        ),
        "streams": [p["proxy"] for p in mesh.get("proxy-cp", "/v1/proxies")["proxies"]],
        "webhook": mesh.get("injector", "/v1/webhook"),
    }


@pytest.fixture(scope="module")
def shared_mesh(mesh_dir: Path, kube: KubeApi) -> Iterator[tuple[Mesh, dict[str, Any]]]:
    """The services, started once, and the baseline each test starts from: taken once the
    caBundle is the mesh's trust bundle and every service is ready with its loops up."""
    # one start serves the group: a slow start on a loaded machine must not fail all of it
    with running_mesh(mesh_dir, kube, {}, timeout=START_TIMEOUT) as mesh:
        trust = base64.b64encode((mesh.state_dir / "trust-bundle.pem").read_bytes()).decode()

        def settled() -> dict[str, Any]:  # empty (falsy) until settled
            now = snapshot(mesh, kube)
            up = all(all(loops.values()) for loops in now["loops"].values())
            ready = set(now["ready"].values()) == {200}
            return now if up and ready and now["ca_bundles"] == [trust] else {}

        baseline = asyncio.run(eventually(settled, timeout=START_TIMEOUT, message="settled"))
        yield mesh, baseline


@pytest.fixture
def mesh(shared_mesh: tuple[Mesh, dict[str, Any]], kube: KubeApi, mesh_dir: Path) -> Iterator[Mesh]:
    """The shared mesh. After the test: the pods it stored are deleted (a pod-bound token
    dies with its pod), the pod's mount is emptied (the agent's startup probe looks for its
    bootstrap there), a stopped service starts again on its ports, and the fixture waits
    until :func:`snapshot` is the baseline again."""
    shared, baseline = shared_mesh
    ports = {
        name: (
            int(p.endpoint.grpc_address.rsplit(":", 1)[1]),
            int(p.endpoint.admin_url.rsplit(":", 1)[1]),
        )
        for name, p in shared.processes.items()
    }
    yield shared
    for name, process in shared.processes.items():
        if process.process is None or process.process.poll() is not None:
            process.start(timeout=START_TIMEOUT, ports=ports[name])
    api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kube.write_kubeconfig(mesh_dir / "reset-kubeconfig"))
    )
    core: Any = client.CoreV1Api(api_client)
    pods = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in kube.objects("", "pods")}
    for namespace, name in pods - set(baseline["stored"]["pods"]):
        core.delete_namespaced_pod(name, namespace)
    api_client.close()
    shutil.rmtree(shared.mount, ignore_errors=True)
    back_to(baseline, lambda: snapshot(shared, kube))


@pytest.fixture
def own_kube() -> Iterator[KubeApi]:
    """An API server of its own (the renewal test's)."""
    with KubeApi() as api:
        yield api


@pytest.fixture
def extra_env() -> dict[str, dict[str, str]]:
    """Settings of one process or another, for a mesh of its own (see the renewal test)."""
    return {}


@pytest.fixture
def own_mesh(
    tmp_path: Path, own_kube: KubeApi, extra_env: dict[str, dict[str, str]]
) -> Iterator[Mesh]:
    """A mesh of its own, with its own Redis and state directory, set with ``extra_env``."""
    with running_mesh(tmp_path, own_kube, extra_env) as mesh:
        yield mesh


@SHARED
def test_an_injected_pods_agent_enrolls_and_its_envoy_joins_the_mesh(
    mesh: Mesh, kube: KubeApi, tmp_path: Path
) -> None:
    # the caBundle the API server checks the webhook with is the mesh's trust bundle
    trust_bundle = (mesh.state_dir / "trust-bundle.pem").read_bytes()
    asyncio.run(
        eventually(
            lambda: ca_bundles(kube) == [base64.b64encode(trust_bundle).decode()], timeout=10
        )
    )
    # the counts are the shared mesh's: this test's are the changes
    injected_before = metric(mesh.processes["injector"], INJECTED)
    enrolled_before = metric(mesh.processes["proxy-cp"], ENROLLED)
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
    assert metric(mesh.processes["injector"], INJECTED) - injected_before == 1.0
    assert metric(mesh.processes["proxy-cp"], ENROLLED) - enrolled_before == 1.0


@SHARED
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
    own_mesh: Mesh, own_kube: KubeApi, tmp_path: Path
) -> None:
    mesh = own_mesh  # its certmanager's proxy certificates are short-lived
    kubelet = Kubelet(mesh, own_kube, tmp_path, injected(mesh))
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


@SHARED
def test_enrollment_refuses_what_the_token_does_not_prove(
    mesh: Mesh, kube: KubeApi, tmp_path: Path
) -> None:
    from trellis_cli.agent import AgentConfig, AgentError, enroll

    # the counts and the log are the shared mesh's: this test's are what it adds
    proxy_cp, certmanager = mesh.processes["proxy-cp"], mesh.processes["certmanager"]
    reasons = ("not_bound", "wrong_audience", "no_token", "not_authenticated")
    before = {reason: metric(proxy_cp, refusals(reason)) for reason in (*reasons, "enrolled")}
    logged = len(certmanager.logs())
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

    after = {reason: metric(proxy_cp, refusals(reason)) for reason in before}
    for reason in reasons:
        assert after[reason] > before[reason], (reason, before, after)
    assert "enroll.refused" in certmanager.logs()[logged:]
    assert after["enrolled"] == before["enrolled"], (before, after)
