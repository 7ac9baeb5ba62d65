"""POST /mutate over TLS with real AdmissionReview JSON; the returned JSONPatch is applied
with ``jsonpatch`` to the pod as the API server sent it, and the result is checked."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import pytest
import yaml
from cryptography import x509
from prometheus_client import CollectorRegistry

from trellis_injector.domain.injection import TOKEN_VOLUME, VOLUME, Sidecar
from trellis_injector.domain.onboarding import MeshSidecar
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Unavailable
from trellis_injector.sidecars import PodAgents, SidecarInjector
from trellis_injector.testing import FakeCatalog, FixedControlPlane
from trellis_injector.transport import webhook
from trellis_injector.transport.webhook import WebhookServer
from trellis_kube import injection
from trellis_kube.injection import Exclusions
from trellis_testing import eventually
from trellis_testing.admission import pod_review
from trellis_testing.identities import LocalCA

SPIFFE = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
SIDECAR = Sidecar(
    envoy_image="envoyproxy/envoy:v1.40.0",
    init_image="trellis-init:test",
    agent_image="trellis:test",
)
MESH_ROOT = "-----BEGIN CERTIFICATE-----\nbWVzaCByb290\n-----END CERTIFICATE-----\n"


def deployment_pod(**metadata: Any) -> dict[str, Any]:
    """A pod as the API server sends it for a Deployment's ReplicaSet: no name, no
    annotations, no init containers; its own volume (the projected token)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "cart-7c9f8d-",
            "namespace": "shop",
            "labels": {"app": "cart", "pod-template-hash": "7c9f8d"},
            **metadata,
        },
        "spec": {
            "serviceAccountName": "cart-sa",
            "containers": [
                {
                    "name": "cart",
                    "image": "shop/cart:1",
                    "ports": [{"containerPort": 8080}],
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-x1",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "volumes": [{"name": "kube-api-access-x1", "projected": {"sources": []}}],
        },
    }


def review(pod: dict[str, Any], uid: str | None = None, **request: Any) -> dict[str, Any]:
    return pod_review(pod, "shop", uid, **request)


class Harness:
    """The webhook served over TLS on a free port, with the control plane faked."""

    def __init__(
        self,
        callers: webhook.CallerCheck | None = None,
        monitored: Callable[[str], bool | None] | None = None,
    ) -> None:
        self.monitored = monitored
        self.registry = CollectorRegistry()
        self.catalog = FakeCatalog()
        self.control_plane = FixedControlPlane("10.0.0.9")
        self.metrics = InjectorMetrics(self.registry)
        self.injector = self.make_injector()
        ca = LocalCA()
        self.identity = ca.identity("injector")
        self.server = WebhookServer(
            webhook.create_app(self.injector, self.metrics, callers),
            self.identity,
            "127.0.0.1",
            0,
            callers,
        )
        self.client = httpx.AsyncClient(verify=self.identity.client_ssl_context(), timeout=10)

    def make_injector(self) -> SidecarInjector:
        agents = PodAgents(
            self.control_plane,
            self.catalog,
            lambda: MESH_ROOT.encode(),
            SPIFFE,
            "proxy-cp.trellis-system.svc",
        )
        return SidecarInjector(agents, SIDECAR, self.metrics, monitored=self.monitored)

    async def post(
        self, body: Any, query: str = "?timeout=10s", client: httpx.AsyncClient | None = None
    ) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return await (client or self.client).post(
            f"https://127.0.0.1:{self.server.port}/mutate{query}",
            content=content,
            headers={"Content-Type": "application/json"},
            # the name the API server dials: the serving certificate must name it
            extensions={"sni_hostname": "injector.trellis-system.svc"},
        )

    async def answer(self, body: Any, query: str = "?timeout=10s") -> dict[str, Any]:
        response = await self.post(body, query)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["apiVersion"] == "admission.k8s.io/v1"
        assert answer["kind"] == "AdmissionReview"
        assert answer["response"]["uid"] == body["request"]["uid"]
        result: dict[str, Any] = answer["response"]
        return result

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(f"trellis_injector_{name}_total", labels) or 0.0


@pytest.fixture
async def hook() -> AsyncIterator[Harness]:
    harness = Harness()
    stop = asyncio.Event()
    task = asyncio.create_task(harness.server.run(stop))
    await eventually(lambda: harness.server.port, timeout=10, message="the webhook listens")
    try:
        yield harness
    finally:
        await harness.client.aclose()
        stop.set()
        await task


def patched(pod: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(pod, ops)
    return result


def containers(pod: dict[str, Any], key: str = "containers") -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"].get(key, [])}


def check_well_formed(pod: dict[str, Any]) -> None:
    """What the API server would refuse: duplicate names, no image, a mount of no volume."""
    every = [*pod["spec"]["containers"], *pod["spec"].get("initContainers", [])]
    names = [c["name"] for c in every]
    assert len(names) == len(set(names)), names
    assert all(c.get("image") for c in every)
    volumes = [v["name"] for v in pod["spec"].get("volumes", [])]
    assert len(volumes) == len(set(volumes))
    for c in every:
        for mount in c.get("volumeMounts", []):
            assert mount["name"] in volumes, (c["name"], mount)


async def test_a_deployments_pod_is_injected(hook: Harness) -> None:
    pod = deployment_pod()
    body = review(pod)
    response = await hook.answer(body)
    result = patched(pod, response)

    check_well_formed(result)
    assert "name" not in result["metadata"]  # generateName is the API server's business
    assert containers(result)["cart"] == pod["spec"]["containers"][0]  # kept as it was
    assert result["spec"]["volumes"][0] == pod["spec"]["volumes"][0]
    envoy = containers(result)["envoy"]
    assert envoy["image"] == "envoyproxy/envoy:v1.40.0"
    assert envoy["args"][:2] == ["-c", "/etc/trellis/proxy/envoy.yaml"]
    assert envoy["securityContext"]["runAsUser"] == 1337
    init, _ = result["spec"]["initContainers"]
    assert init["name"] == "trellis-init"
    assert init["image"] == "trellis-init:test"  # iptables only
    assert "NET_ADMIN" in init["securityContext"]["capabilities"]["add"]
    assert "REDIRECT --to-ports 15001" in init["command"][2]

    # no label or annotation speaks for the proxy's identity: the agent's token will
    assert injection.PROXY_UUID_LABEL not in result["metadata"]["labels"]
    assert result["metadata"]["labels"]["app"] == "cart"
    assert hook.catalog.expected == {}  # nothing onboarded, nothing stored at admission
    # the agent: a native sidecar after the redirection, before the pod's containers
    agent = containers(result, "initContainers")["trellis-agent"]
    assert agent["restartPolicy"] == "Always"
    assert agent["image"] == "trellis:test"
    assert agent["command"] == ["trellis-agent"]
    assert agent["securityContext"]["runAsUser"] == 1337  # let out by the redirection
    probe = agent["startupProbe"]["exec"]["command"]
    assert probe == ["test", "-s", "/etc/trellis/proxy/envoy.yaml"]
    env = {e["name"]: e["value"] for e in agent["env"]}
    assert env["TRELLIS_AGENT_ADDRESS"] == "10.0.0.9:15012"
    assert env["TRELLIS_AGENT_SERVER_NAME"] == "proxy-cp.trellis-system.svc"
    assert env["TRELLIS_AGENT_CA"] == MESH_ROOT
    assert env["TRELLIS_AGENT_SERVICE"] == "cart"  # from the `app` label
    assert env["TRELLIS_AGENT_TOKEN"] == "/var/run/secrets/trellis/token"
    bootstrap = yaml.safe_load(env["TRELLIS_AGENT_BOOTSTRAP"])
    assert bootstrap["node"]["id"] == "enrolling"  # the proxy certificate names it
    trellis = bootstrap["node"]["metadata"]["trellis"]
    # the pod's traffic is redirected: proxy-cp's listeners go by original destination;
    # the proxy's own workload certificate and key stay in the agent's folder
    assert trellis["capture"] is True
    assert trellis["workload_dir"] == "/etc/trellis/proxy"
    volumes = {v["name"]: v for v in result["spec"]["volumes"]}
    assert volumes[VOLUME] == {"name": VOLUME, "emptyDir": {"medium": "Memory"}}
    [source] = volumes[TOKEN_VOLUME]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "trellis"
    assert source["serviceAccountToken"]["path"] == "token"
    assert {m["name"] for m in envoy["volumeMounts"]} == {VOLUME}  # no token for Envoy
    assert all(m["name"] != TOKEN_VOLUME for m in containers(result)["cart"]["volumeMounts"])
    assert hook.count("admissions", outcome="injected") == 1


async def test_a_bare_pod_gets_its_lists_and_maps_created(hook: Harness) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "job-"},
        "spec": {"containers": [{"name": "job", "image": "busybox"}]},
    }
    result = patched(pod, await hook.answer(review(pod)))
    check_well_formed(result)
    assert "labels" not in result["metadata"]
    assert [v["name"] for v in result["spec"]["volumes"]] == [VOLUME, TOKEN_VOLUME]
    # without a label or annotation naming it, the service is the service account's
    agent = containers(result, "initContainers")["trellis-agent"]
    assert {"name": "TRELLIS_AGENT_SERVICE", "value": "default"} in agent["env"]


async def test_existing_init_containers_run_first(hook: Harness) -> None:
    pod = deployment_pod()
    pod["spec"]["initContainers"] = [{"name": "migrate", "image": "shop/migrate:1"}]
    result = patched(pod, await hook.answer(review(pod)))
    check_well_formed(result)
    assert [c["name"] for c in result["spec"]["initContainers"]] == [
        "migrate", "trellis-init", "trellis-agent"
    ]  # fmt: skip


async def test_opt_out_and_already_injected_are_left_alone(hook: Harness) -> None:
    opted_out = deployment_pod(annotations={"trellis.dev/sidecar-injection": "disabled"})
    response = await hook.answer(review(opted_out))
    assert response["allowed"] is True
    assert "patch" not in response

    injected = deployment_pod()
    injected["spec"]["containers"].append({"name": "envoy", "image": "envoyproxy/envoy:v1"})
    response = await hook.answer(review(injected))
    assert response["allowed"] is True
    assert "patch" not in response

    host = deployment_pod()
    host["spec"]["hostNetwork"] = True
    assert "patch" not in await hook.answer(review(host))

    assert hook.catalog.calls == 0  # nothing asked for them
    assert hook.count("admissions", outcome="skipped_opt_out") == 1
    assert hook.count("admissions", outcome="skipped_already") == 1
    assert hook.count("admissions", outcome="skipped_host_network") == 1


async def test_exclusions_reach_the_init_containers_rules(hook: Harness) -> None:
    pod = deployment_pod(
        annotations={
            "trellis.dev/sidecar-injection": "enabled",
            "trellis.dev/outbound-port-exclusion-list": "5432, 6379",
            "trellis.dev/inbound-port-exclusion-list": "9090",
            "trellis.dev/outbound-ip-range-exclusion-list": "10.0.0.0/8,169.254.169.254",
        }
    )
    result = patched(pod, await hook.answer(review(pod)))
    script = containers(result, "initContainers")["trellis-init"]["command"][2]
    assert "-A TRELLIS_OUTPUT -p tcp --dport 5432 -j RETURN" in script
    assert "-A TRELLIS_OUTPUT -p tcp --dport 6379 -j RETURN" in script
    assert "-A TRELLIS_INBOUND -p tcp --dport 9090 -j RETURN" in script
    assert "-A TRELLIS_OUTPUT -d 10.0.0.0/8 -j RETURN" in script
    assert "-A TRELLIS_OUTPUT -d 169.254.169.254/32 -j RETURN" in script
    # the sidecar's statistics port is reached directly, not through the inbound redirect
    assert "-A TRELLIS_INBOUND -p tcp --dport 15010 -j RETURN" in script
    # the pod's own annotations are kept, and Prometheus is pointed at the sidecar
    assert result["metadata"]["annotations"] == {
        **pod["metadata"]["annotations"],
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "15010",
        "prometheus.io/path": "/stats/prometheus",
    }
    ports = containers(result, "containers")["envoy"]["ports"]
    assert {"name": "trellis-stats", "containerPort": 15010, "protocol": "TCP"} in ports
    agent = containers(result, "initContainers")["trellis-agent"]
    env = {e["name"]: e["value"] for e in agent["env"]}
    bootstrap = json.loads(env["TRELLIS_AGENT_BOOTSTRAP"])
    [listener] = bootstrap["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["port_value"] == 15010


async def test_mesh_config_exclusions_and_log_level_join_the_pods_own(hook: Harness) -> None:
    excluded = Exclusions(
        inbound_ports=(8443,), outbound_ports=(5432,), outbound_ranges=("1.0.0.0/8",)
    )
    hook.catalog.sidecar = MeshSidecar(log_level="debug", exclusions=excluded)
    own = {"trellis.dev/outbound-port-exclusion-list": "5432, 6379"}
    pod = deployment_pod(annotations=own)
    result = patched(pod, await hook.answer(review(pod)))
    script = containers(result, "initContainers")["trellis-init"]["command"][2]
    assert script.count("--dport 5432 -j RETURN") == 1  # in both lists, excluded once
    assert "-A TRELLIS_OUTPUT -p tcp --dport 6379 -j RETURN" in script  # the pod's
    assert "-A TRELLIS_INBOUND -p tcp --dport 8443 -j RETURN" in script  # MeshConfig's
    assert "-A TRELLIS_OUTPUT -d 1.0.0.0/8 -j RETURN" in script
    assert containers(result)["envoy"]["args"][-2:] == ["--log-level", "debug"]

    hook.catalog.sidecar = MeshSidecar()  # no MeshConfig: Envoy's default level
    result = patched(pod, await hook.answer(review(pod)))
    assert "--log-level" not in containers(result)["envoy"]["args"]


async def test_a_pod_that_sets_its_own_scrape_annotations_keeps_them(hook: Harness) -> None:
    pod = deployment_pod(
        annotations={
            "trellis.dev/sidecar-injection": "enabled",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "8080",
        }
    )
    result = patched(pod, await hook.answer(review(pod)))
    assert result["metadata"]["annotations"] == pod["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("trellis.dev/outbound-port-exclusion-list", "5432,http"),
        ("trellis.dev/inbound-port-exclusion-list", "70000"),
        ("trellis.dev/outbound-ip-range-exclusion-list", "10.0.0.0/33"),
        ("trellis.dev/sidecar-injection", "maybe"),
    ],
)
async def test_a_bad_annotation_is_denied_naming_it(
    hook: Harness, annotation: str, value: str
) -> None:
    response = await hook.answer(review(deployment_pod(annotations={annotation: value})))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert annotation in response["status"]["message"]
    assert hook.catalog.calls == 0
    assert hook.count("admissions", outcome="denied_invalid") == 1


async def test_a_clashing_container_name_is_denied(hook: Harness) -> None:
    pod = deployment_pod()
    pod["spec"]["initContainers"] = [{"name": "trellis-init", "image": "mine"}]
    response = await hook.answer(review(pod))
    assert response["allowed"] is False
    assert "'trellis-init'" in response["status"]["message"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        ({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}, "apiVersion"),
        ({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}, "request"),
        (
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}},
            "request.uid",
        ),
    ],
)
async def test_a_malformed_body_gets_400_with_a_message(
    hook: Harness, body: Any, named: str
) -> None:
    response = await hook.post(body)
    assert response.status_code == 400
    assert named in response.json()["error"]
    assert hook.count("admission_malformed") == 1


async def test_other_kinds_and_operations_are_allowed_untouched(hook: Harness) -> None:
    body = review(deployment_pod(), operation="UPDATE")
    response = await hook.answer(body, query="")  # no ?timeout= either
    assert response == {"uid": body["request"]["uid"], "allowed": True}
    assert hook.count("admissions", outcome="ignored") == 1


async def test_dry_run_is_answered_like_any_review_since_nothing_is_stored(
    hook: Harness,
) -> None:
    pod = deployment_pod()
    real = patched(pod, await hook.answer(review(pod)))
    dry = patched(pod, await hook.answer(review(pod, dryRun=True)))
    check_well_formed(dry)
    assert dry == real  # the webhook has no side effects: sideEffects None holds


async def test_the_catalog_down_follows_the_failure_policy(hook: Harness) -> None:
    hook.catalog.error = Unavailable("catalog", "connection refused")
    response = await hook.answer(review(deployment_pod()))
    assert response["allowed"] is False  # Fail (the default)
    assert response["status"]["code"] == 500
    assert "catalog is unavailable" in response["status"]["message"]

    hook.injector.failure_policy = "Ignore"
    response = await hook.answer(review(deployment_pod()))
    assert response["allowed"] is True
    assert "patch" not in response
    assert "catalog is unavailable" in response["warnings"][0]
    assert hook.count("admissions", outcome="error") == 2


async def test_a_stalled_catalog_is_answered_within_the_api_servers_timeout(
    hook: Harness,
) -> None:
    stalled = hook.catalog
    stalled.hold = asyncio.Event()
    started = time.monotonic()
    response = await hook.answer(review(deployment_pod()), query="?timeout=2s")
    elapsed = time.monotonic() - started
    assert stalled.calls == 1
    assert response["allowed"] is False
    assert "not done within 1.5s" in response["status"]["message"]
    assert elapsed < 2.0
    stalled.hold.set()


async def test_the_serving_certificate_must_name_the_service() -> None:
    identity = LocalCA().identity("injector")
    with pytest.raises(ValueError, match=r"injector\.mesh\.svc"):
        WebhookServer.check_name(identity, "injector.mesh.svc")


def presenting(harness: Harness, tmp_path: Path, ca: LocalCA, name: str) -> httpx.AsyncClient:
    """A client that checks the webhook and presents a certificate ``ca`` issued ``name``."""
    material = ca.issue(name, [x509.DNSName(name)])
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}-key.pem"
    cert.write_bytes(material.cert_chain_pem)
    key.write_bytes(material.key_pem)
    context = harness.identity.client_ssl_context()
    context.load_cert_chain(cert, key)
    return httpx.AsyncClient(verify=context, timeout=10)


async def test_with_a_client_ca_only_the_api_servers_certificate_may_call(
    tmp_path: Path,
) -> None:
    api_servers = LocalCA()
    bundle = tmp_path / "api-server-ca.pem"
    bundle.write_bytes(api_servers.bundle_pem)
    harness = Harness(webhook.CallerCheck(bundle, frozenset({"kube-apiserver"})))
    stop = asyncio.Event()
    task = asyncio.create_task(harness.server.run(stop))
    await eventually(lambda: harness.server.port, timeout=10, message="the webhook listens")
    body = review(deployment_pod())
    try:
        # no certificate: refused by name, counted, nothing reviewed
        answer = await harness.post(body)
        assert answer.status_code == 403
        assert "client certificate of the API server is required" in answer.json()["error"]
        # the API server's CA, another name (a tenant who got a certificate from it)
        async with presenting(harness, tmp_path, api_servers, "x") as impostor:
            answer = await harness.post(body, client=impostor)
        assert answer.status_code == 403
        assert "names x, not kube-apiserver" in answer.json()["error"]
        # a certificate of another CA does not even finish the handshake
        async with presenting(harness, tmp_path, LocalCA(), "kube-apiserver") as stranger:
            with pytest.raises(httpx.HTTPError):
                await harness.post(body, client=stranger)
        assert harness.count("admissions", outcome="injected") == 0
        # the API server itself
        async with presenting(harness, tmp_path, api_servers, "kube-apiserver") as api_server:
            answer = await harness.post(body, client=api_server)
        assert answer.status_code == 200
        assert answer.json()["response"]["allowed"] is True
        assert harness.count("admissions", outcome="injected") == 1
        assert harness.count("webhook_refused", reason="no_client_certificate") == 1
        assert harness.count("webhook_refused", reason="unexpected_client") == 1
    finally:
        await harness.client.aclose()
        stop.set()
        await task


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda b: b["request"]["object"]["metadata"].update(namespace="payments"), "'payments'"),
        (lambda b: b["request"].update(subResource="status"), "subResource"),
        (lambda b: b["request"].update(namespace=""), "request.namespace is empty"),
        (lambda b: b["request"]["kind"].update(version="v2"), "v2"),
        (lambda b: b["request"].update(resource={"group": "", "resource": "secrets"}), "secrets"),
    ],
)
async def test_a_review_whose_parts_disagree_is_denied_as_a_forgery_would_be(
    hook: Harness, change: Callable[[dict[str, Any]], None], named: str
) -> None:
    body = review(deployment_pod(namespace="shop"))
    change(body)
    response = await hook.answer(body)
    assert response["allowed"] is False
    assert "inconsistent review" in response["status"]["message"]
    assert named in response["status"]["message"]
    assert hook.count("admissions", outcome="denied_inconsistent") == 1
    assert hook.catalog.calls == 0


async def test_a_namespace_the_mesh_does_not_monitor_is_left_alone() -> None:
    known: dict[str, bool] = {"shop": False}
    harness = Harness(monitored=known.get)
    stop = asyncio.Event()
    task = asyncio.create_task(harness.server.run(stop))
    await eventually(lambda: harness.server.port, timeout=10, message="the webhook listens")
    try:
        response = await harness.answer(review(deployment_pod()))
        assert response["allowed"] is True
        assert "patch" not in response  # a review for a namespace the mesh does not watch
        assert harness.count("admissions", outcome="skipped_unmonitored") == 1
        del known["shop"]  # not read yet: the failure policy (Fail) answers
        response = await harness.answer(review(deployment_pod()))
        assert response["allowed"] is False
        assert "not read yet" in response["status"]["message"]
        known["shop"] = True
        assert "patch" in await harness.answer(review(deployment_pod()))
    finally:
        await harness.client.aclose()
        stop.set()
        await task
