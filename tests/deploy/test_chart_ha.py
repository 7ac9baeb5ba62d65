"""The chart's high availability (issue 33): ``ha.enabled`` and the values it sets.

``helm template --set ha.enabled=true`` must render every component twice, rolled out
without a gap, kept up through drains by PodDisruptionBudgets, spread over nodes and zones,
with the Lease RBAC for exactly the leader-elected components and Redis under Sentinel in
every component's environment. Each knob is also checked on its own, a value set on its
own winning over ``ha``, and the default rendering (one replica each) is checked to stay
what it was. The Sentinel pods' start scripts are checked against the environment the
StatefulSet gives them; ``test_chart_wiring`` checks their ACL against the code.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.helmchart import CHART, HelmFailed, Rendered, helm, render

COMPONENTS = ("certmanager", "catalog", "endpoints-k8s", "endpoints-vm", "proxy-cp", "injector")
LEADER_ELECTED = ("certmanager", "endpoints-vm")
HOSTNAME = "kubernetes.io/hostname"
ZONE = "topology.kubernetes.io/zone"
SCRIPTS = CHART / "files" / "redis-sentinel"
HEADLESS = "trellis-redis-headless.trellis-system.svc"
SENTINEL_URL = "redis+sentinel://" + ",".join(
    f"trellis-redis-{i}.{HEADLESS}:26379" for i in range(3)
) + "/trellis/0"  # fmt: skip


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm")


@pytest.fixture(scope="module")
def default(scratch: Path) -> Rendered:
    return render(scratch)


@pytest.fixture(scope="module")
def ha(scratch: Path) -> Rendered:
    return render(scratch, "ha.enabled=true")


def selector(rendered: Rendered, kind: str, name: str) -> dict[str, str]:
    labels: dict[str, str] = rendered.get(kind, name)["spec"]["selector"]["matchLabels"]
    return labels


def workloads(rendered: Rendered) -> list[tuple[str, str]]:
    """(kind, name) of every Deployment and StatefulSet."""
    return [
        (kind, o["metadata"]["name"])
        for kind in ("Deployment", "StatefulSet")
        for o in rendered.all(kind)
    ]


def pod_spec(rendered: Rendered, kind: str, name: str) -> dict[str, Any]:
    return dict(rendered.get(kind, name)["spec"]["template"]["spec"])


@pytest.mark.parametrize("values", [("ha.enabled=true",), ("redis.mode=sentinel",)])
def test_lint_passes_strict(scratch: Path, values: tuple[str, ...]) -> None:
    sets = [arg for value in values for arg in ("--set", value)]
    out = helm("lint", "--strict", str(CHART), "--namespace", "trellis-system", *sets,
               scratch=scratch)  # fmt: skip
    assert "1 chart(s) linted, 0 chart(s) failed" in out


def test_ha_runs_two_of_every_component_rolled_out_without_a_gap(ha: Rendered) -> None:
    for name in COMPONENTS:
        spec = ha.get("Deployment", name)["spec"]
        assert spec["replicas"] == 2, name
        # a new pod is ready before an old one goes: never fewer than 2
        assert spec["strategy"] == {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        }, name


def test_the_default_rendering_keeps_one_replica_each_and_no_ha_objects(
    default: Rendered,
) -> None:
    for name in COMPONENTS:
        spec = default.get("Deployment", name)["spec"]
        assert spec["replicas"] == (2 if name == "proxy-cp" else 1), name
        # a single replica is replaced by a ready one too (leader-elected work waits for
        # the Lease), instead of Recreate's gap
        assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
        pod = spec["template"]["spec"]
        assert "affinity" not in pod
        assert "topologySpreadConstraints" not in pod
        assert "priorityClassName" not in pod
    assert default.all("PodDisruptionBudget") == []
    assert default.all("StatefulSet") == []
    assert default.get("Deployment", "trellis-redis")["spec"]["replicas"] == 1
    assert default.env("catalog")["TRELLIS_REDIS_URL"] == (
        "redis://trellis-redis.trellis-system.svc:6379/0"
    )
    assert "TRELLIS_REDIS_MIN_REPLICAS_ACK" not in default.env("catalog")


def test_a_disruption_budget_for_every_replicated_workload(ha: Rendered) -> None:
    budgets = {b["metadata"]["name"]: b["spec"] for b in ha.all("PodDisruptionBudget")}
    assert set(budgets) == {*COMPONENTS, "trellis-redis"}
    for kind, name in workloads(ha):
        budget = budgets[name]
        assert budget["maxUnavailable"] == 1
        assert "minAvailable" not in budget
        # exactly this workload's pods
        assert budget["selector"]["matchLabels"] == selector(ha, kind, name)


def test_budgets_follow_the_replicas_without_ha(scratch: Path) -> None:
    rendered = render(scratch, "podDisruptionBudget.enabled=true", "catalog.replicas=3")
    # not for a single pod: a budget of one would block every drain
    assert rendered.names("PodDisruptionBudget") == {"catalog", "proxy-cp"}
    off = render(scratch, "ha.enabled=true", "podDisruptionBudget.enabled=false")
    assert off.all("PodDisruptionBudget") == []


def test_pods_prefer_other_nodes_and_spread_over_zones_and_nodes(ha: Rendered) -> None:
    for kind, name in workloads(ha):
        pod = pod_spec(ha, kind, name)
        labels = selector(ha, kind, name)
        anti = pod["affinity"]["podAntiAffinity"]
        [term] = anti["preferredDuringSchedulingIgnoredDuringExecution"]
        assert term["weight"] == 100
        assert term["podAffinityTerm"] == {
            "topologyKey": HOSTNAME,
            "labelSelector": {"matchLabels": labels},
        }
        spread = {c["topologyKey"]: c for c in pod["topologySpreadConstraints"]}
        assert set(spread) == {ZONE, HOSTNAME}
        for constraint in spread.values():
            assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"
            assert constraint["maxSkew"] == 1
            assert constraint["labelSelector"] == {"matchLabels": labels}


def test_required_anti_affinity_takes_a_pod_down_before_adding_one(scratch: Path) -> None:
    rendered = render(
        scratch, "ha.enabled=true", "podAntiAffinity=required",
        "topologySpread.whenUnsatisfiable=DoNotSchedule",
    )  # fmt: skip
    for name in COMPONENTS:
        spec = rendered.get("Deployment", name)["spec"]
        anti = spec["template"]["spec"]["affinity"]["podAntiAffinity"]
        [term] = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == HOSTNAME
        # with one pod per node, a surge pod may find no node: the rollout frees one first
        assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 1}
        constraints = spec["template"]["spec"]["topologySpreadConstraints"]
        assert {c["whenUnsatisfiable"] for c in constraints} == {"DoNotSchedule"}


def test_the_operators_affinity_is_kept_and_its_own_anti_affinity_wins(scratch: Path) -> None:
    rendered = render(
        scratch, "ha.enabled=true",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )  # fmt: skip
    affinity = rendered.pod("catalog")["affinity"]
    assert set(affinity) == {"nodeAffinity", "podAntiAffinity"}
    own = render(scratch, "ha.enabled=true", "affinity.podAntiAffinity.x=1")
    assert own.pod("catalog")["affinity"] == {"podAntiAffinity": {"x": 1}}


def test_a_value_set_on_its_own_wins_over_ha(scratch: Path) -> None:
    rendered = render(
        scratch, "ha.enabled=true", "catalog.replicas=3", "injector.replicas=1",
        "podAntiAffinity=none", "topologySpread.enabled=false", "redis.mode=standalone",
    )  # fmt: skip
    assert rendered.get("Deployment", "catalog")["spec"]["replicas"] == 3
    assert rendered.get("Deployment", "certmanager")["spec"]["replicas"] == 2
    assert rendered.get("Deployment", "injector")["spec"]["replicas"] == 1
    # a budget only where 2 pods or more run
    assert "injector" not in rendered.names("PodDisruptionBudget")
    assert "catalog" in rendered.names("PodDisruptionBudget")
    for _, pod in rendered.pods():
        assert "affinity" not in pod
        assert "topologySpreadConstraints" not in pod
    assert rendered.all("StatefulSet") == []
    assert rendered.env("catalog")["TRELLIS_REDIS_URL"].startswith("redis://trellis-redis.")


def test_priority_class_for_every_pod_and_per_component(scratch: Path) -> None:
    rendered = render(
        scratch, "ha.enabled=true", "priorityClassName=system-cluster-critical",
        "proxyCp.priorityClassName=mesh-data-plane",
    )  # fmt: skip
    for kind, name in workloads(rendered):
        wanted = "mesh-data-plane" if name == "proxy-cp" else "system-cluster-critical"
        assert pod_spec(rendered, kind, name)["priorityClassName"] == wanted, name


def test_only_the_leader_elected_components_elect_and_may_touch_a_lease(
    scratch: Path, ha: Rendered
) -> None:
    roles = {r["metadata"]["name"]: r for r in ha.all("Role")}
    bindings = {b["metadata"]["name"]: b for b in ha.all("RoleBinding")}
    lease_roles = {n for n, r in roles.items() if {"leases"} & set(r["rules"][0]["resources"])}
    assert lease_roles == {f"trellis-{c}-lease" for c in LEADER_ELECTED}
    for component in LEADER_ELECTED:
        name = f"trellis-{component}-lease"
        assert roles[name]["metadata"]["namespace"] == "trellis-system"
        assert roles[name]["rules"] == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
             "resourceNames": [f"trellis-{component}"], "verbs": ["get", "update"]},
        ]  # fmt: skip
        binding = bindings[name]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": name}  # fmt: skip
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": component, "namespace": "trellis-system"}
        ]
    for component in COMPONENTS:
        env = ha.env(component)
        elected = env.get("TRELLIS_LEADER_ELECTION")
        assert elected == ("kubernetes" if component in LEADER_ELECTED else None), component
        # a distinct identity per replica: the pod's name
        assert env["TRELLIS_INSTANCE"] == "$(POD_NAME)"
        assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        if elected:  # the Lease is read with the API server's token
            assert ha.pod(component)["automountServiceAccountToken"] is True
    disabled = render(scratch, "ha.enabled=true", "endpointsVm.enabled=false")
    assert "trellis-endpoints-vm-lease" not in disabled.names("Role")


# -- Redis under Sentinel -----------------------------------------------------------------


def test_ha_runs_redis_under_sentinel_and_every_component_finds_it_there(ha: Rendered) -> None:
    assert "trellis-redis" not in ha.names("Deployment")
    redis = ha.get("StatefulSet", "trellis-redis")["spec"]
    assert redis["replicas"] == 3
    assert redis["serviceName"] == "trellis-redis-headless"
    pod = redis["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["redis", "sentinel"]
    ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c["ports"]}
    assert ports == {"redis": 6379, "sentinel": 26379}
    # the pods' stable names resolve before they are ready: they find each other at start
    headless = ha.get("Service", "trellis-redis-headless")["spec"]
    assert headless["clusterIP"] == "None"
    assert headless["publishNotReadyAddresses"] is True
    assert headless["selector"] == selector(ha, "StatefulSet", "trellis-redis")
    assert {p["name"]: p["port"] for p in headless["ports"]} == ports
    for name in COMPONENTS:
        env = ha.env(name)
        assert env["TRELLIS_REDIS_URL"] == SENTINEL_URL, name
        assert env["TRELLIS_REDIS_MIN_REPLICAS_ACK"] == "1"
        assert env["TRELLIS_REDIS_USERNAME"] == name  # its ACL user, on Redis and Sentinel
    # the Redis pods reach each other (replication, the Sentinels), the components both
    [rule] = ha.get("NetworkPolicy", "trellis-redis")["spec"]["ingress"]
    assert rule["ports"] == [{"port": "redis"}, {"port": "sentinel"}]
    labels = redis["template"]["metadata"]["labels"]
    [peer] = rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= labels.items()


def test_each_redis_pod_keeps_its_data_on_a_volume_of_its_own(scratch: Path, ha: Rendered) -> None:
    spec = ha.get("StatefulSet", "trellis-redis")["spec"]
    [claim] = spec["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "data" not in {v["name"] for v in spec["template"]["spec"]["volumes"]}
    rendered = render(
        scratch, "redis.mode=sentinel", "redis.persistence.size=5Gi",
        "redis.persistence.storageClass=fast",
    )  # fmt: skip
    [claim] = rendered.get("StatefulSet", "trellis-redis")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert claim["spec"]["storageClassName"] == "fast"
    assert rendered.get("Deployment", "catalog")["spec"]["replicas"] == 1  # sentinel alone
    # a quorum set always has its budget, with or without ha
    assert rendered.names("PodDisruptionBudget") == {"trellis-redis"}
    ephemeral = render(scratch, "ha.enabled=true", "redis.persistence.enabled=false")
    spec = ephemeral.get("StatefulSet", "trellis-redis")["spec"]
    assert "volumeClaimTemplates" not in spec
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}


def test_sentinel_values_reach_the_pods_and_bad_ones_are_refused(scratch: Path) -> None:
    rendered = render(
        scratch, "redis.mode=sentinel", "redis.sentinel.replicas=5", "redis.sentinel.quorum=3",
        "redis.sentinel.masterName=mesh", "redis.sentinel.minReplicasAck=2",
    )  # fmt: skip
    spec = rendered.get("StatefulSet", "trellis-redis")["spec"]
    assert spec["replicas"] == 5
    sentinel = {c["name"]: c for c in spec["template"]["spec"]["containers"]}["sentinel"]
    env = {e["name"]: e.get("value") for e in sentinel["env"]}
    assert (env["SENTINEL_QUORUM"], env["REDIS_MASTER_NAME"], env["REDIS_REPLICAS"]) == (
        "3", "mesh", "5",
    )  # fmt: skip
    url = rendered.env("catalog")["TRELLIS_REDIS_URL"]
    assert url.endswith("/mesh/0")
    assert url.count(":26379") == 5
    assert rendered.env("catalog")["TRELLIS_REDIS_MIN_REPLICAS_ACK"] == "2"
    with pytest.raises(HelmFailed, match=r"quorum \(4\) cannot be more than"):
        render(scratch, "redis.mode=sentinel", "redis.sentinel.quorum=4")
    with pytest.raises(HelmFailed, match=r"minReplicasAck \(3\) must be below"):
        render(scratch, "redis.mode=sentinel", "redis.sentinel.minReplicasAck=3")


def _script_variables(path: Path) -> set[str]:
    """The environment variables a start script reads (upper-case names)."""
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", path.read_text()))


def test_the_start_scripts_get_every_variable_they_read_and_parse(ha: Rendered) -> None:
    spec = ha.get("StatefulSet", "trellis-redis")["spec"]["template"]["spec"]
    configmap = ha.get("ConfigMap", "trellis-redis-scripts")["data"]
    assert set(configmap) == {p.name for p in SCRIPTS.glob("*.sh")}
    common = _script_variables(SCRIPTS / "common.sh")
    for container in spec["containers"]:
        assert container["command"] == ["sh", f"/scripts/{container['name']}.sh"]
        commands = [container["command"]]
        if container["name"] == "redis":  # a master hands over before it stops
            commands.append(container["lifecycle"]["preStop"]["exec"]["command"])
            assert commands[-1] == ["sh", "/scripts/prestop.sh"]
        given = {e["name"] for e in container["env"]}
        for command in commands:
            script = SCRIPTS / Path(command[1]).name
            wanted = (_script_variables(script) | common) - {"REDISCLI_AUTH"}
            assert wanted <= given, (script.name, wanted - given)
        # the secrets the scripts read (/etc/redis-users/<user>) are mounted, and only those
        users = {v["name"]: v for v in spec["volumes"]}["users"]["secret"]["items"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {i["path"] for i in users} == {
            env["REDIS_REPLICATION_USER"], env["REDIS_SENTINEL_USER"],
        }  # fmt: skip
    for text in configmap.values():  # what the pods run is what the files hold, and parses
        done = subprocess.run(["sh", "-n"], input=text, text=True, capture_output=True, check=False)
        assert done.returncode == 0, done.stderr
