"""The Helm chart ``deploy/helm/trellis``: ``helm lint`` and ``helm template``, offline.

Each rule of the chart is checked on the rendered objects, with default values and with
others (a provider disabled, replicas, an external Redis, the operator's CA, another
image). Where the chart restates what the code does (RBAC, the CRDs, the Redis ACL,
settings, the MeshConfig), the check is against the code itself, in test_chart_wiring.py.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helmchart import CHART, HelmFailed, Rendered, helm, render

COMPONENTS = ("certmanager", "catalog", "endpoints-k8s", "endpoints-vm", "proxy-cp", "injector")
ADMIN_PORTS = {
    "certmanager": 15021,
    "catalog": 15011,
    "endpoints-k8s": 15031,
    "endpoints-vm": 15041,
    "proxy-cp": 15051,
    "injector": 15061,
}
MONITORED = "trellis.dev/monitored-by"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def default(scratch: Path) -> Rendered:
    return render(scratch)


def test_lint_passes_strict(scratch: Path) -> None:
    out = helm("lint", "--strict", str(CHART), "--namespace", "trellis-system", scratch=scratch)
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_each_component_has_a_deployment_service_and_account_of_its_name(
    default: Rendered,
) -> None:
    for kind in ("Deployment", "Service", "ServiceAccount"):
        assert set(COMPONENTS) <= default.names(kind), kind
    for obj in default.objects:
        namespace = obj["metadata"].get("namespace")
        assert namespace in (None, "trellis-system"), obj["metadata"]
    for name in COMPONENTS:
        pod = default.pod(name)
        assert pod["serviceAccountName"] == name
        service = default.get("Service", name)
        labels = default.get("Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
        assert labels["app.kubernetes.io/component"] == name


def test_probes_resources_and_no_privilege(default: Rendered) -> None:
    for name, pod in default.pods():
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod.get("hostNetwork") is not True
        assert pod.get("hostPID") is not True
        assert "initContainers" not in pod  # only injected pods have trellis-init
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["runAsNonRoot"] is True
            assert context.get("privileged") is not True
            assert context["capabilities"] == {"drop": ["ALL"]}  # nothing added
            assert container["resources"]["requests"]["cpu"], name
            assert container["resources"]["requests"]["memory"], name
            assert container["livenessProbe"]
            assert container["readinessProbe"]
        if name == "trellis-redis":
            continue
        container = pod["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["admin"] == ADMIN_PORTS[name]
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            check = container[probe]["httpGet"]
            assert (check["path"], check["port"], check["scheme"]) == (path, "admin", "HTTPS")


def test_webhook_configuration_is_what_a_v1_api_server_requires(default: Rendered) -> None:
    configuration = default.get("MutatingWebhookConfiguration", "trellis-injector")
    assert configuration["apiVersion"] == "admissionregistration.k8s.io/v1"
    [webhook] = configuration["webhooks"]
    assert webhook["name"].count(".") >= 2  # a fully qualified name
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["namespaceSelector"] == {"matchLabels": {MONITORED: "trellis"}}
    assert webhook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["failurePolicy"] == "Fail"
    assert 1 <= webhook["timeoutSeconds"] <= 30
    service = webhook["clientConfig"]["service"]
    assert service == {"name": "injector", "namespace": "trellis-system", "path": "/mutate",
                       "port": 443}  # fmt: skip
    # the Service's 443 reaches the injector's webhook port, 9443
    ports = {
        p["port"]: p["targetPort"] for p in default.get("Service", "injector")["spec"]["ports"]
    }
    container = default.container("injector")
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named[ports[443]] == 9443
    # the caBundle is the mesh root the chart made, which the injector's certificate chains to
    bundle = base64.b64decode(webhook["clientConfig"]["caBundle"])
    assert bundle == default.secret("trellis-ca")["tls.crt"]


def test_a_provider_is_swapped_by_disabling_its_deployment(scratch: Path) -> None:
    rendered = render(scratch, "endpointsVm.enabled=false")
    for kind in ("Deployment", "Service", "ServiceAccount"):
        assert "endpoints-vm" not in rendered.names(kind)
        assert "endpoints-k8s" in rendered.names(kind)
    without_injector = render(scratch, "injector.enabled=false")
    assert not without_injector.all("MutatingWebhookConfiguration")
    assert "trellis-injector" not in without_injector.names("ClusterRole")


def test_replicas_and_image(scratch: Path, default: Rendered) -> None:
    rendered = render(
        scratch, "proxyCp.replicas=3", "image.repository=registry.example/mesh/trellis",
        "image.tag=1.2.3", "catalog.replicas=5",
    )  # fmt: skip
    proxy_cp = rendered.get("Deployment", "proxy-cp")
    assert proxy_cp["spec"]["replicas"] == 3
    assert rendered.get("Deployment", "catalog")["spec"]["replicas"] == 5
    for name in COMPONENTS:  # a registry record, and an identity in elections, each
        assert rendered.env(name)["TRELLIS_INSTANCE"] == "$(POD_NAME)"
        assert default.get("Deployment", name)["spec"]["replicas"] == (
            2 if name == "proxy-cp" else 1
        )
    for _, pod in rendered.pods():
        image = pod["containers"][0]["image"]
        assert image.startswith("registry.example/mesh/trellis:1.2.3") or "redis" in image
    # the injected pods: the init container's image has iptables only, same tag; the agent
    # runs the Trellis image
    injector = rendered.env("injector")
    assert injector["TRELLIS_INJECTOR_INIT_IMAGE"] == "ghcr.io/trellis-mesh/trellis-init:1.2.3"
    assert injector["TRELLIS_INJECTOR_AGENT_IMAGE"] == "registry.example/mesh/trellis:1.2.3"
    moved = render(scratch, "image.initRepository=registry.example/mesh/trellis-init")
    assert moved.env("injector")["TRELLIS_INJECTOR_INIT_IMAGE"] == (
        "registry.example/mesh/trellis-init:0.1.0"
    )


def test_metrics_port_annotations_and_an_opt_in_pod_monitor(
    scratch: Path, default: Rendered
) -> None:
    """Prometheus without the mesh CA: each component's plain-HTTP /metrics on the pod IP."""
    for name in COMPONENTS:
        deployment = default.get("Deployment", name)["spec"]["template"]
        annotations = deployment["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/port"] == "15090"
        env = default.env(name)
        assert (env["TRELLIS_METRICS_PORT"], env["TRELLIS_METRICS_HOST"]) == ("15090", "$(POD_IP)")
        ports = {
            p["name"]: p["containerPort"] for p in deployment["spec"]["containers"][0]["ports"]
        }
        assert ports["metrics"] == 15090
    assert not default.all("PodMonitor")
    monitored = render(
        scratch, "metrics.podMonitor.enabled=true", "metrics.podMonitor.labels.release=prom",
        "networkPolicy.metricsNamespaceSelector.matchLabels.name=monitoring",
    )  # fmt: skip
    [monitor] = monitored.all("PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    selected = monitor["spec"]["selector"]["matchExpressions"][0]["values"]
    assert sorted(selected) == sorted(COMPONENTS)
    policy = monitored.get("NetworkPolicy", "trellis-catalog")["spec"]["ingress"]
    scrape = [rule for rule in policy if "namespaceSelector" in rule["from"][0]]
    assert scrape[0]["ports"] == [{"port": "admin"}, {"port": "metrics"}]
    off = render(scratch, "metrics.port=0", "metrics.podMonitor.enabled=true")
    assert not off.all("PodMonitor")
    assert "TRELLIS_METRICS_PORT" not in off.env("catalog")
    assert "prometheus.io/scrape" not in off.get("Deployment", "catalog")["spec"]["template"][
        "metadata"
    ].get("annotations", {})
    assert default.container("catalog")["image"] == "ghcr.io/trellis-mesh/trellis:0.1.0"


@pytest.mark.parametrize(
    "url",
    ["rediss://redis.example.org:6380/2", "redis+sentinel://s1.example.org:26379,s2:26379/mesh/1"],
)
def test_an_external_redis_with_credentials_from_a_secret(scratch: Path, url: str) -> None:
    rendered = render(
        scratch, "redis.mode=external", "redis.external.url=" + url.replace(",", "\\,"),
        "redis.external.existingSecret=my-redis", "redis.external.minReplicasAck=1",
    )  # fmt: skip
    assert "trellis-redis" not in rendered.names("Deployment")
    assert not rendered.all("StatefulSet")
    assert not {"trellis-redis", "trellis-redis-headless"} & rendered.names("Service")
    assert "trellis-redis-users" not in rendered.names("Secret")
    assert "trellis-redis-acl" not in rendered.names("Secret")
    assert "trellis-redis" not in rendered.names("NetworkPolicy")
    for name in COMPONENTS:
        env = rendered.env(name)
        assert env["TRELLIS_REDIS_URL"] == url
        assert env["TRELLIS_REDIS_MIN_REPLICAS_ACK"] == "1"
        assert env["TRELLIS_REDIS_USERNAME"] == name
        volumes = {v["name"]: v for v in rendered.pod(name)["volumes"]}
        secret = volumes["redis-password"]["secret"]
        assert secret["secretName"] == "my-redis"
        assert secret["items"] == [{"key": name, "path": "password"}]
    needs = r"redis\.mode=external needs redis\.external"
    with pytest.raises(HelmFailed, match=needs + r"\.existingSecret"):
        render(scratch, "redis.mode=external", "redis.external.url=rediss://redis.example.org")
    with pytest.raises(HelmFailed, match=needs + r"\.url"):
        render(scratch, "redis.mode=external", "redis.external.existingSecret=my-redis")


def test_the_operators_own_ca(scratch: Path) -> None:
    rendered = render(scratch, "ca.existingSecret=corp-ca")
    assert "trellis-ca" not in rendered.names("Secret")
    [webhook] = rendered.get("MutatingWebhookConfiguration", "trellis-injector")["webhooks"]
    assert "caBundle" not in webhook["clientConfig"]  # the injector sets it from certmanager
    volumes = {
        v["name"]: v["secret"] for v in rendered.pod("certmanager")["volumes"] if "secret" in v
    }
    assert volumes["ca"]["secretName"] == "corp-ca"
    trust = {v["name"]: v["secret"] for v in rendered.pod("catalog")["volumes"] if "secret" in v}
    assert trust["trust"] == {"secretName": "corp-ca", "defaultMode": 0o444,
                              "items": [{"key": "ca.crt", "path": "ca.crt"}]}  # fmt: skip


def test_failure_policy_is_the_same_in_the_webhook_and_the_injector(scratch: Path) -> None:
    rendered = render(scratch, "injector.failurePolicy=Ignore")
    [webhook] = rendered.get("MutatingWebhookConfiguration", "trellis-injector")["webhooks"]
    assert webhook["failurePolicy"] == "Ignore"
    assert rendered.env("injector")["TRELLIS_INJECTOR_FAILURE_POLICY"] == "Ignore"


def test_the_webhook_admits_only_the_api_servers_certificate_when_its_ca_is_given(
    scratch: Path, default: Rendered
) -> None:
    assert "TRELLIS_INJECTOR_WEBHOOK_CLIENT_CA" not in default.env("injector")
    rendered = render(scratch, "injector.webhookClient.caSecret=api-server-client-ca")
    env = rendered.env("injector")
    assert env["TRELLIS_INJECTOR_WEBHOOK_CLIENT_NAMES"] == "kube-apiserver"
    path = Path(env["TRELLIS_INJECTOR_WEBHOOK_CLIENT_CA"])
    pod = rendered.get("Deployment", "injector")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "webhook-client"]
    assert volume["secret"]["secretName"] == "api-server-client-ca"
    assert volume["secret"]["items"] == [{"key": "ca.crt", "path": path.name}]
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "webhook-client"]
    assert mount["mountPath"] == str(path.parent)
    for other in ("catalog", "proxy-cp"):  # the injector's alone
        spec = rendered.get("Deployment", other)["spec"]["template"]["spec"]
        assert all(v["name"] != "webhook-client" for v in spec["volumes"])


def test_another_namespace_is_refused_with_the_reason(scratch: Path) -> None:
    with pytest.raises(HelmFailed, match="install Trellis into the namespace trellis-system"):
        render(scratch, namespace="mesh")


def test_secrets_are_kept_and_never_in_plain_values(default: Rendered) -> None:
    for name in ("trellis-ca", "trellis-kek"):
        annotations = default.get("Secret", name)["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
    assert len(default.secret("trellis-kek")["kek"]) == 32
    secret_values = {v for n in default.names("Secret") for v in default.secret(n).values()}
    for _, pod in default.pods():
        for container in pod["containers"]:
            for item in container.get("env", []):
                value = item.get("value", "")
                assert value.encode() not in secret_values or not value, item["name"]


def test_the_components_get_only_the_admin_tokens_digest(default: Rendered) -> None:
    secret = default.secret("trellis-admin-token")
    assert secret["sha256"].decode() == hashlib.sha256(secret["token"]).hexdigest()
    for name in ("certmanager", "catalog", "endpoints-k8s", "endpoints-vm", "injector", "proxy-cp"):
        env = {item["name"]: item for item in default.container(name)["env"]}
        assert "TRELLIS_ADMIN_TOKEN" not in env, name  # the token itself is in no pod
        # each checks it: on its mutating routes, and on its listings
        reference = env["TRELLIS_ADMIN_TOKEN_SHA256"]["valueFrom"]["secretKeyRef"]
        assert reference == {"name": "trellis-admin-token", "key": "sha256"}


def test_notes_say_how_to_label_a_namespace(scratch: Path) -> None:
    out = helm(
        "install", "trellis", str(CHART), "--namespace", "trellis-system", "--dry-run=client",
        "--set", "endpointsVm.enabled=false", scratch=scratch,
    )  # fmt: skip
    assert f"kubectl label namespace <namespace> {MONITORED}=trellis" in out
    assert "endpoints-vm   disabled" in out


def test_crds_are_templates_so_upgrades_update_them(default: Rendered) -> None:
    # Helm never upgrades crds/ (more in test_chart_crds.py)
    assert "trafficsplits.split.smi-spec.io" in default.names("CustomResourceDefinition")
    assert not (CHART / "crds").exists()


def _ingress(rendered: Rendered, name: str) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = rendered.get("NetworkPolicy", name)["spec"]["ingress"]
    return rules


def _open_ports(rules: list[dict[str, Any]]) -> set[str]:
    """The ports some rule opens to every source (no ``from``)."""
    return {p["port"] for rule in rules if "from" not in rule for p in rule["ports"]}


def test_network_policies_let_only_the_components_reach_redis_and_each_other(
    default: Rendered,
) -> None:
    components = {"certmanager", "catalog", "endpoints-k8s", "endpoints-vm", "proxy-cp", "injector"}
    names = {p["metadata"]["name"] for p in default.all("NetworkPolicy")}
    assert names == {f"trellis-{c}" for c in components} | {"trellis-redis"}
    for component in components:
        policy = default.get("NetworkPolicy", f"trellis-{component}")
        # it selects exactly the component's pods
        assert (
            policy["spec"]["podSelector"]["matchLabels"]
            == default.get("Deployment", component)["spec"]["selector"]["matchLabels"]
        )
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        first = _ingress(default, f"trellis-{component}")[0]
        (peer,) = first["from"]
        assert set(peer) == {"podSelector"}  # the release's pods, in this namespace only
        assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/part-of"] == "trellis"
        assert [p["port"] for p in first["ports"]] == ["grpc", "admin"]
    assert _ingress(default, "trellis-redis") == [
        {"from": _ingress(default, "trellis-catalog")[0]["from"], "ports": [{"port": "redis"}]}
    ]
    # open to anyone only what must be: xDS, Destination and pod enrollment, the webhook,
    # VM onboarding
    open_ports = {"grpc", "destination", "enroll"}
    assert _open_ports(_ingress(default, "trellis-proxy-cp")) == open_ports
    assert _open_ports(_ingress(default, "trellis-injector")) == {"webhook", "admin"}
    assert _open_ports(_ingress(default, "trellis-endpoints-vm")) == {"admin"}
    for component in ("certmanager", "catalog", "endpoints-k8s"):
        assert _open_ports(_ingress(default, f"trellis-{component}")) == set()


def test_the_webhook_and_vm_ports_narrow_to_the_cidrs_given(scratch: Path) -> None:
    rendered = render(
        scratch,
        "networkPolicy.apiServerCIDRs={172.20.0.0/16}",
        "networkPolicy.vmCIDRs={192.168.10.0/24}",
        "networkPolicy.metricsNamespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring",
    )
    injector = _ingress(rendered, "trellis-injector")
    assert _open_ports(injector) == set()
    webhook = next(r for r in injector if r["ports"] == [{"port": "webhook"}])
    assert webhook["from"] == [{"ipBlock": {"cidr": "172.20.0.0/16"}}]
    vms = _ingress(rendered, "trellis-endpoints-vm")[-1]
    assert vms["from"] == [{"ipBlock": {"cidr": "192.168.10.0/24"}}]
    metrics = _ingress(rendered, "trellis-catalog")[1]
    assert metrics["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    off = render(scratch / "off", "networkPolicy.enabled=false")
    assert off.all("NetworkPolicy") == []
