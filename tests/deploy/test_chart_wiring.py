"""The chart against the code it deploys: what it restates must be what the code does.

* RBAC: each component's rules are exactly the API calls its code makes (the informers'
  list calls, the status writes, the Secret and webhook calls), with no wildcard.
* Settings: each container's ``TRELLIS_*`` variables are settings its service has, and
  they validate into the values meant; every ``*_FILE`` is a file a volume provides.
* The Redis ACL is ``redisacl.aclfile_text`` of the rendered passwords (under Sentinel
  too, with the Sentinels' own ``redisacl.sentinel_acl_lines``); the CA is one certmanager
  loads; the KEK is 32 bytes; the MeshConfig parses as the catalog parses it.
* The leader-elected components may make exactly the Lease calls ``trellis_kube.leases``
  makes, on their own Lease.
"""

from __future__ import annotations

import base64
import datetime as dt
import inspect
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from kubernetes import client

from tests.deploy.chartprocs import chart_acl
from tests.deploy.helmchart import Rendered, chartgen, render
from trellis_catalog import gatewaystatus
from trellis_catalog.kubesource import KubeSource, meshconfig_of_configmap, resources
from trellis_catalog.settings import CatalogSettings
from trellis_catalog.sources import Sources
from trellis_certmanager.domain.authority import load_provided
from trellis_certmanager.settings import CertManagerSettings
from trellis_common.documents import all_kinds
from trellis_common.documents.base import Origin
from trellis_endpoints_k8s.settings import EndpointsK8sSettings
from trellis_endpoints_k8s.watcher import Watcher
from trellis_endpoints_vm.settings import EndpointsVmSettings
from trellis_injector.settings import InjectorSettings
from trellis_kube import leases
from trellis_kube.documents import KubeDocuments
from trellis_kube.namespaces import MonitoredNamespaces
from trellis_proxy_cp.settings import ProxyCpSettings
from trellis_runtime import redisacl
from trellis_runtime.sentinelurl import SentinelUrl
from trellis_runtime.settings import SHARED_PREFIX, ServiceSettings, is_shared

SETTINGS: dict[str, type[ServiceSettings]] = {
    "certmanager": CertManagerSettings,
    "catalog": CatalogSettings,
    "endpoints-k8s": EndpointsK8sSettings,
    "endpoints-vm": EndpointsVmSettings,
    "proxy-cp": ProxyCpSettings,
    "injector": InjectorSettings,
}
POD_IP = "10.1.2.3"
API_GROUPS = {"CoreV1Api": "", "DiscoveryV1Api": "discovery.k8s.io"}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render(tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    return render(tmp_path_factory.mktemp("helm"), "ha.enabled=true")


#: The components that elect a leader with a Lease (trellis-<component>).
LEADER_ELECTED = ("certmanager", "endpoints-vm")


def test_the_generated_chart_files_are_current() -> None:
    assert chartgen().stale() == [], "run `make chart`"


# -- RBAC ---------------------------------------------------------------------------------


def granted(rendered: Rendered, component: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) the component's roles allow."""
    rules = []
    for kind, binding_kind in (("ClusterRole", "ClusterRoleBinding"), ("Role", "RoleBinding")):
        for binding in rendered.all(binding_kind):
            if any(s["name"] == component for s in binding["subjects"]):
                rules += rendered.get(kind, binding["roleRef"]["name"])["rules"]
    found = set()
    for rule in rules:
        for part in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[part], f"{component}: a wildcard in {rule}"
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                found |= {(group, resource, verb) for verb in rule["verbs"]}
    return found


def listed(list_call: Any) -> tuple[str, str]:
    """(apiGroup, resource) of a client's ``list_<kind>_for_all_namespaces`` method."""
    name = re.fullmatch(r"list_(\w+?)(_for_all_namespaces)?", list_call.__name__)
    assert name is not None, list_call
    kind = name.group(1).replace("_", "")
    plural = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
    return API_GROUPS[type(list_call.__self__).__name__], plural


def watches(calls: list[tuple[str, str]]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for g, r in calls for v in ("list", "watch")}


#: The kubernetes client's method verbs, as RBAC names them.
CLIENT_VERBS = {"read": "get", "create": "create", "replace": "update", "patch": "patch",
                "delete": "delete", "list": "list"}  # fmt: skip


def lease_calls() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every Lease call the election code makes."""
    calls = re.findall(r"\.(\w+?)_namespaced_lease\(", inspect.getsource(leases))
    assert calls, "trellis_kube.leases makes no Lease call"
    return {("coordination.k8s.io", "leases", CLIENT_VERBS[c]) for c in calls}


def test_rbac_grants_each_component_exactly_the_calls_its_code_makes(rendered: Rendered) -> None:
    api = client.ApiClient()
    namespaces = listed(MonitoredNamespaces(client.CoreV1Api(api), "m").informer.list_call)

    elected = lease_calls()
    watcher = Watcher(api, "trellis")  # only built, to read its informers' list calls
    k8s_calls = [namespaces] + [listed(i.list_call) for i in watcher.informers.values()]
    assert watches(k8s_calls) <= granted(rendered, "endpoints-k8s")
    # it reads the cluster, and writes nothing (no Lease: no replica leads)
    assert {v for _, _, v in granted(rendered, "endpoints-k8s")} == {"get", "list", "watch"}

    source: Any = KubeSource(api, "trellis", "trellis-system", None, Sources(None))  # type: ignore[arg-type]
    catalog_calls = [namespaces] + [(r[0].group, r[0].plural) for r in resources().values()]
    catalog = granted(rendered, "catalog")
    assert watches(catalog_calls) <= catalog
    for versions in resources().values():
        if not versions[0].core:  # no status write to a kind with none (ReferenceGrant)
            writes = versions[0].kind not in gatewaystatus.STATUSLESS_KINDS
            status = (versions[0].group, f"{versions[0].plural}/status", "patch")
            assert (status in catalog) == writes, versions[0]
    assert ("", "configmaps", "watch") in catalog  # the MeshConfig ConfigMap's informer
    role = rendered.get("Role", "trellis-catalog")["rules"]
    assert role == [{"apiGroups": [""], "resources": ["configmaps"],
                     "resourceNames": ["trellis-mesh-config"],
                     "verbs": ["get", "list", "watch"]}]  # fmt: skip
    assert source.informers  # the catalog's informers are the resources() above

    injector = granted(rendered, "injector")
    # pod agents enroll themselves: the injector reads and writes no Secret, no pod
    assert not {resource for _, resource, _ in injector} & {"secrets", "pods"}
    webhook = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
    assert {(*webhook, "get"), (*webhook, "patch")} <= injector

    assert (
        granted(rendered, "certmanager")
        == {("authentication.k8s.io", "tokenreviews", "create")} | elected
    )
    istio = all_kinds()
    reader = KubeDocuments(api, "trellis", istio, kinds=("ServiceEntry", "WorkloadEntry"))
    vm_calls = [namespaces] + [(r[0].group, r[0].plural) for r in reader.candidates.values()]
    assert len(vm_calls) == 3
    assert granted(rendered, "endpoints-vm") == watches(vm_calls) | elected | {
        (g, r, "get") for g, r in vm_calls
    }
    assert granted(rendered, "proxy-cp") == set()  # no Kubernetes API at all
    assert rendered.pod("proxy-cp")["automountServiceAccountToken"] is False
    for component in ("certmanager", "catalog", "endpoints-k8s", "injector", "endpoints-vm"):
        secret_verbs = {v for g, r, v in granted(rendered, component) if r == "secrets"}
        assert not secret_verbs or component == "injector"


def test_the_leader_elected_components_make_exactly_the_lease_calls_on_their_own_lease(
    ha: Rendered,
) -> None:
    elected = lease_calls()
    for component in SETTINGS:
        leases_granted = {g for g in granted(ha, component) if g[1] == "leases"}
        assert leases_granted == (elected if component in LEADER_ELECTED else set()), component
    for component in LEADER_ELECTED:
        role = ha.get("Role", f"trellis-{component}-lease")
        for rule in role["rules"]:  # only create is not limited to the Lease's name
            if rule["verbs"] != ["create"]:
                assert rule["resourceNames"] == [leases.lease_name(component)]
        env = environment(ha, component)
        assert env["TRELLIS_LEASE_NAMESPACE"] == role["metadata"]["namespace"]


# -- settings and files -------------------------------------------------------------------


def environment(rendered: Rendered, component: str) -> dict[str, str]:
    env = {}
    for name, value in rendered.env(component).items():
        if isinstance(value, dict):
            value = {"fieldRef": POD_IP, "secretKeyRef": "a-token"}[next(iter(value))]
        env[name] = value.replace("$(POD_IP)", POD_IP).replace("$(POD_NAME)", "proxy-cp-abc")
    return env


@pytest.mark.parametrize("values", ["default", "ha"])
def test_each_variable_is_a_setting_of_its_service(
    values: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    rendered: Rendered = request.getfixturevalue("rendered" if values == "default" else values)
    for component, settings_cls in SETTINGS.items():
        env = environment(rendered, component)
        fields = settings_cls.model_fields
        for name in env:
            if not name.startswith(SHARED_PREFIX) or name.startswith("POD_"):
                continue
            own = name.removeprefix(settings_cls.env_prefix()).lower()
            shared = name.removeprefix(SHARED_PREFIX).lower()
            known = (name.startswith(settings_cls.env_prefix()) and own in fields) or (
                shared in fields and is_shared(fields[shared])
            )
            assert known, f"{component}: {name} is no setting of {settings_cls.__name__}"
        with monkeypatch.context() as patch:
            for name in [n for n in __import__("os").environ if n.startswith(SHARED_PREFIX)]:
                patch.delenv(name)
            for name, value in env.items():
                patch.setenv(name, value)
            settings = settings_cls()
        assert settings.bind_host == POD_IP  # the registry announces the pod's address
        assert settings.redis_username == component
        assert settings.log_format == "json"
        if component != "certmanager":
            assert settings.certmanager_admin_address == "certmanager.trellis-system.svc:15021"
            assert settings.trust_bundle_file == Path("/etc/trellis/trust/ca.crt")
        if isinstance(settings, CatalogSettings):
            assert settings.meshconfig_configmap == "trellis-mesh-config"
        assert settings.instance == "proxy-cp-abc"  # the pod's name: one identity each
        assert settings.leader_election == ("kubernetes" if component in LEADER_ELECTED else "auto")
        if values == "ha":  # the Sentinels' URL, parsed as the services parse it
            target = SentinelUrl.parse(settings.redis_url)
            assert len(target.sentinels) == 3
            assert target.master == "trellis"
            assert settings.redis_min_replicas_ack == 1
        if isinstance(settings, InjectorSettings):
            assert settings.webhook_service == "injector.trellis-system.svc"
            assert (settings.xds_host, settings.xds_port) == ("proxy-cp.trellis-system.svc", 15128)


def provided(pod: dict[str, Any], container: dict[str, Any]) -> set[PurePosixPath]:
    """The files the container's volume mounts give it (Secret items, projected tokens)."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = set()
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        paths = [i["path"] for i in (volume.get("secret") or {}).get("items", [])]
        for source in (volume.get("projected") or {}).get("sources", []):
            paths += [p["path"] for p in source.values()]
        files |= {PurePosixPath(mount["mountPath"]) / p for p in paths}
    return files


def test_every_file_a_setting_names_is_mounted(rendered: Rendered) -> None:
    for component in SETTINGS:
        pod, container = rendered.pod(component), rendered.container(component)
        files = provided(pod, container)
        named = {n: v for n, v in environment(rendered, component).items() if n.endswith("_FILE")}
        assert named, component
        for name, path in named.items():
            assert PurePosixPath(path) in files, f"{component}: {name}={path} is not mounted"
        assert pod["securityContext"]["fsGroup"]  # how non-root reads the Secrets' files


def test_components_join_with_a_token_certmanager_accepts(rendered: Rendered) -> None:
    audience = CertManagerSettings.model_fields["join_audience"].default
    for component in SETTINGS:
        if component == "certmanager":
            continue
        volumes = {v["name"]: v for v in rendered.pod(component)["volumes"]}
        [source] = volumes["trellis-token"]["projected"]["sources"]
        token = source["serviceAccountToken"]
        assert (token["audience"], token["expirationSeconds"]) == (audience, 600)
    assert environment(rendered, "certmanager")["TRELLIS_CERTMANAGER_JOIN_AUDIENCE"] == audience


# -- the generated secrets and the MeshConfig ---------------------------------------------


def _chart_acl(rendered: Rendered, passwords: dict[str, str], where: Path) -> dict[str, str]:
    """What the chart's ACL script (files/redis-acl.sh) writes from ``passwords``."""
    (where / "users").mkdir(parents=True)
    for user, password in passwords.items():
        (where / "users" / user).write_text(password)
    written = chart_acl(rendered, where / "users", where / "acl")
    return {name: path.read_text() for name, path in written.items()}


def test_the_in_chart_redis_acl_is_the_codes(rendered: Rendered, tmp_path: Path) -> None:
    passwords = {k: v.decode() for k, v in rendered.secret("trellis-redis-users").items()}
    assert set(passwords) == {redisacl.ADMIN, *redisacl.COMPONENTS}
    assert len(set(passwords.values())) == len(passwords)  # one each
    acl = _chart_acl(rendered, passwords, tmp_path)["users.acl"]
    assert acl == redisacl.aclfile_text(passwords)
    assert not any(p in acl for p in passwords.values())  # hashes only
    command = rendered.container("trellis-redis")["command"]
    assert command[command.index("--aclfile") + 1] == "/etc/redis/users.acl"
    assert command[command.index("--") - 1] == "/etc/redis/users.acl"  # what the script writes
    assert "sentinel.rules" not in rendered.get("ConfigMap", "trellis-redis-acl")["data"]


def test_the_sentinel_redis_acls_are_the_codes(ha: Rendered, tmp_path: Path) -> None:
    passwords = {k: v.decode() for k, v in ha.secret("trellis-redis-users").items()}
    users = {redisacl.ADMIN, *redisacl.COMPONENTS, redisacl.REPLICATION, redisacl.SENTINEL}
    assert set(passwords) == users
    assert len(set(passwords.values())) == len(passwords)
    written = _chart_acl(ha, passwords, tmp_path)
    acl = written["users.acl"]
    assert acl == redisacl.aclfile_text(passwords)
    sentinels = written["users.conf"]
    assert sentinels == "\n".join(redisacl.sentinel_acl_lines(passwords)) + "\n"
    assert not any(p in acl + sentinels for p in passwords.values())  # hashes only
    pod = ha.get("StatefulSet", "trellis-redis")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert (env["REDIS_REPLICATION_USER"], env["REDIS_SENTINEL_USER"]) == (
        redisacl.REPLICATION, redisacl.SENTINEL,
    )  # fmt: skip


def test_certmanager_loads_the_ca_the_chart_makes(rendered: Rendered) -> None:
    ca = rendered.secret("trellis-ca")
    now = dt.datetime.now(dt.UTC)
    authority = load_provided(ca["tls.crt"], ca["tls.key"], ca["ca.crt"], now)
    assert authority.cert.not_valid_after_utc > now + dt.timedelta(days=3000)
    assert authority.roots == (authority.cert,)  # tls.crt and ca.crt: one root, once
    trust = {v["name"]: v for v in rendered.pod("catalog")["volumes"]}["trust"]["secret"]
    assert trust["secretName"] == "trellis-ca"


def test_the_meshconfig_configmap_is_what_the_catalog_reads(rendered: Rendered) -> None:
    configmap = rendered.get("ConfigMap", "trellis-mesh-config")
    document = meshconfig_of_configmap(configmap, Origin("chart"))
    settings = document.resource.settings()
    assert settings.trust_domain == "cluster.local"
    assert settings.permissive is False
    encoded = base64.b64encode(b"unused")  # the ConfigMap holds no secret
    assert encoded.decode() not in str(configmap)
