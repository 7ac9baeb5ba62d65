"""The chart's pods as local processes: each Deployment's container started with exactly
the environment and files ``helm template`` renders, what only a cluster provides remapped
(see ``test_chart_processes``). The pod test bed (``tests/netns``) runs its control plane
the same way, inside its node's network namespace.

A rendering with Redis under Sentinel (``ha.enabled``) gets a real Sentinel Redis (a
master, two replicas, three sentinels) with the chart's passwords, and, with ``replicas``,
as many processes of each component as its Deployment has replicas, each named as its pod
would be (``catalog-0``, ``catalog-1``).

Redis gets its ACL users as the chart's Redis pods do: the chart's own script
(``files/redis-acl.sh``, from the rendered ConfigMap ``trellis-redis-acl``) run with ``sh``
on the rules and the users Secret's passwords. Secrets the operator made (a GitOps install:
``ca.existingSecret`` and the like) are not rendered; they are passed in as ``given``."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client

from tests.deploy import chartcluster
from tests.deploy.helmchart import Rendered
from trellis_identity import tokens
from trellis_kube.client import api_client
from trellis_testing import RedisServer
from trellis_testing.kube import KubeApi
from trellis_testing.ports import free_port
from trellis_testing.redis_backend import redis_server
from trellis_testing.redis_sentinel import SentinelRedis
from trellis_testing.services import ServiceProcess, stop_together

MODULES = {
    "certmanager": "trellis_certmanager.main",
    "catalog": "trellis_catalog.main",
    "endpoints-k8s": "trellis_endpoints_k8s.main",
    "endpoints-vm": "trellis_endpoints_vm.main",
    "proxy-cp": "trellis_proxy_cp.main",
    "injector": "trellis_injector.main",
}
#: Components that call the Kubernetes API (in a pod: in-cluster config).
KUBE = ("certmanager", "catalog", "endpoints-k8s", "endpoints-vm", "injector")


#: Redis as the chart renders it: one server, or a set under Sentinel.
ChartRedis = RedisServer | SentinelRedis
#: Secrets that exist in the cluster apart from the rendering: name -> key -> value.
Given = Mapping[str, Mapping[str, bytes]]


def secret_data(rendered: Rendered, name: str, given: Given | None = None) -> Mapping[str, bytes]:
    """The Secret ``name``: one the operator made (``given``), else the chart's."""
    if given is not None and name in given:
        return given[name]
    return rendered.secret(name)


def redis_users_secret(rendered: Rendered) -> str:
    """The name of the Secret the in-chart Redis reads its users' passwords from."""
    if rendered.all("StatefulSet"):
        spec = rendered.get("StatefulSet", "trellis-redis")["spec"]["template"]["spec"]
    else:
        spec = rendered.pod("trellis-redis")
    volumes = {v["name"]: v for v in spec["volumes"]}
    name = volumes["passwords" if "passwords" in volumes else "users"]["secret"]["secretName"]
    return str(name)


def chart_acl(rendered: Rendered, passwords: Path, root: Path) -> dict[str, Path]:
    """Run the chart's ACL script as the Redis pods do: the rendered ConfigMap's files under
    ``root``, the users' passwords in ``passwords`` (a file per user). Returns the files it
    wrote: ``users.acl`` (Redis' aclfile) and, under Sentinel, ``users.conf`` (the
    Sentinels' users)."""
    root.mkdir(parents=True, exist_ok=True)
    for key, text in rendered.get("ConfigMap", "trellis-redis-acl")["data"].items():
        (root / key).write_text(text)
    args = [str(root / "redis.rules"), str(root / "users.acl")]
    if (root / "sentinel.rules").is_file():
        args += [str(root / "sentinel.rules"), str(root / "users.conf")]
    done = subprocess.run(
        ["sh", str(root / "redis-acl.sh"), str(passwords), *args],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"the chart's redis-acl.sh failed: {done.stderr.strip()}")
    return {Path(out).name: Path(out) for out in args[1::2]}


def _with_chart_aclfile(server: RedisServer, aclfile: Path) -> None:
    """Have ``server`` start with the aclfile the chart's script wrote. The test Redis
    writes its own aclfile (from ``trellis_runtime.redisacl``) at each start; this one is
    copied over it after that, so what Redis enforces is what the chart's pods would."""
    prepare = server.prepare

    def chart_prepare() -> bytes:
        login = prepare()  # the password files (kept: the chart's), a replica's config
        shutil.copyfile(aclfile, server.aclfile)
        server.aclfile.chmod(0o600)
        return login

    setattr(server, "prepare", chart_prepare)  # noqa: B010 (mypy refuses a method assignment)


def mounted_files(
    rendered: Rendered, component: str, root: Path, given: Given | None = None
) -> dict[str, Path]:
    """Write what the pod's Secret volumes hold under ``root``; mount path -> local dir."""
    pod = rendered.pod(component)
    volumes = {v["name"]: v for v in pod["volumes"]}
    where = {}
    for mount in rendered.container(component)["volumeMounts"]:
        local = root / component / mount["name"]
        local.mkdir(parents=True)
        secret = volumes[mount["name"]].get("secret")
        if secret is not None:
            data = secret_data(rendered, secret["secretName"], given)
            for item in secret["items"]:
                path = local / item["path"]
                path.write_bytes(data[item["key"]])
                path.chmod(0o600)
        where[mount["mountPath"]] = local
    return where


def environment(
    rendered: Rendered, component: str, mounts: dict[str, Path], redis: ChartRedis,
    certmanager_admin: str, kubeconfig: Path, pod_ip: str = "127.0.0.1",
    fixed_ports: bool = False, pod_name: str = "", given: Given | None = None,
) -> dict[str, str]:  # fmt: skip
    """The container's env, with only what a cluster provides remapped: the pod IP is
    ``pod_ip``, the pod's name ``pod_name`` (default ``<component>-0``), Services (Redis's
    or its Sentinels') are local addresses, mount paths local folders, in-cluster
    configuration a kubeconfig; and, unless ``fixed_ports`` (a network namespace of its
    own), the ports that tests running side by side would share are free ones."""
    pod_name = pod_name or f"{component}-0"
    env = {}
    for item in rendered.container(component)["env"]:
        name, value = item["name"], item.get("value")
        if value is None:
            source = item["valueFrom"]
            if "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = secret_data(rendered, ref["name"], given)[ref["key"]].decode()
            elif source["fieldRef"]["fieldPath"] == "metadata.name":
                value = pod_name
            else:
                value = pod_ip
        value = value.replace("$(POD_IP)", pod_ip).replace("$(POD_NAME)", pod_name)
        for mount, local in mounts.items():
            if value.startswith(mount + "/"):
                value = str(local) + value.removeprefix(mount)
        env[name] = value
    # the Service trellis-redis, or the Sentinel pods' names (the same master name)
    env["TRELLIS_REDIS_URL"] = redis.plain_url
    if "TRELLIS_CERTMANAGER_ADMIN_ADDRESS" in env:  # the Service certmanager
        env["TRELLIS_CERTMANAGER_ADMIN_ADDRESS"] = certmanager_admin
    if component == "injector" and not fixed_ports:
        env["TRELLIS_INJECTOR_WEBHOOK_PORT"] = "0"  # tests run side by side
    if component == "proxy-cp" and not fixed_ports:
        env["TRELLIS_PROXY_CP_DESTINATION_PORT"] = "0"
        env["TRELLIS_PROXY_CP_ENROLL_PORT"] = "0"
    if "TRELLIS_METRICS_PORT" in env:
        # every pod has the same plain-HTTP metrics port, each on its own IP in a cluster;
        # here the pods share one address, so each process gets a free port of its own,
        # from below the kernel's ephemeral range (free_port): a port found by bind(0) was
        # taken by another process's connection before the service bound it (twice, in
        # the HA rendering's twelve processes starting side by side)
        env["TRELLIS_METRICS_PORT"] = str(free_port())
    if component in KUBE:
        prefix = "TRELLIS_" + component.upper().replace("-", "_") + "_"
        env[prefix + "KUBECONFIG"] = str(kubeconfig)
    del env["TRELLIS_STATE_DIR"]  # the process's own (ServiceProcess sets one)
    return env


def chart_redis(rendered: Rendered, root: Path, given: Given | None = None) -> ChartRedis:
    """Redis with the chart's ACL users, written by the chart's script, and the chart's
    passwords (not made anew; from ``given`` with ``redis.existingUsersSecret``): under
    Sentinel when the chart renders its StatefulSet."""
    redis: ChartRedis
    if rendered.all("StatefulSet"):
        spec = rendered.get("StatefulSet", "trellis-redis")["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        redis = SentinelRedis(root, master_name=env["REDIS_MASTER_NAME"])
    else:
        redis = redis_server(root)
    redis.users_dir.mkdir(parents=True, mode=0o700)
    for user, password in secret_data(rendered, redis_users_secret(rendered), given).items():
        redis.password_file(user).write_bytes(password)
        redis.password_file(user).chmod(0o600)
    aclfile = chart_acl(rendered, redis.users_dir, root / "chart-acl")["users.acl"]
    for server in redis.nodes if isinstance(redis, SentinelRedis) else [redis]:
        _with_chart_aclfile(server, aclfile)
    try:
        redis.start()
    except BaseException:
        redis.close()
        raise
    return redis


class ChartControlPlane:
    """Every component of the rendered chart as a process, joined with its ServiceAccount
    token from ``kube`` (the test API server, which also answers TokenReviews), in the
    order a cluster would get them ready: certmanager first.

    ``pod_ip`` is every pod's address (they share one here); ``fixed_ports`` keeps the
    chart's ports (a network namespace of its own has them free); ``replicas`` starts as
    many processes of a component as its Deployment has replicas (else one); ``given`` are
    the Secrets the operator made, which the chart names but does not render."""

    def __init__(
        self, rendered: Rendered, root: Path, kube: KubeApi, pod_ip: str = "127.0.0.1",
        fixed_ports: bool = False, replicas: bool = False, given: Given | None = None,
    ) -> None:  # fmt: skip
        assert not (fixed_ports and replicas), "replicas of one component share no fixed port"
        self.replicas = replicas
        self.given = given
        self.rendered = rendered
        self.root = root
        self.kube = kube
        self.pod_ip = pod_ip
        self.fixed_ports = fixed_ports
        self.state_dir = root / "state"
        self.processes: list[ServiceProcess] = []
        self.redis: ChartRedis | None = None
        self.kubeconfig = root / "kubeconfig"

    def start(self) -> ChartControlPlane:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        # the operator's token (the chart's Secret), where tests and `trellis` read it: the
        # components themselves get only its digest
        secret = self.rendered.env("certmanager")["TRELLIS_ADMIN_TOKEN_SHA256"]["secretKeyRef"]
        token = secret_data(self.rendered, secret["name"], self.given)["token"].decode()
        tokens.token_path(self.state_dir).write_text(token + "\n")
        tokens.token_path(self.state_dir).chmod(0o600)
        self.redis = chart_redis(self.rendered, self.root / "redis", self.given)
        self.kube.write_kubeconfig(self.kubeconfig)
        api: Any = api_client(self.kubeconfig)
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "trellis-system"}})
        configmap = self.rendered.get("ConfigMap", "trellis-mesh-config")
        core.create_namespaced_config_map("trellis-system", configmap)
        chartcluster.create_objects(api, self.rendered, self.given)  # what the CLI reads
        try:
            self._start_components()
        except BaseException:
            self.stop()
            raise
        return self

    def pods(self) -> list[tuple[str, str]]:
        """(component, pod name) of every process to start, certmanager's first."""
        found = []
        for component in MODULES:
            count = self.rendered.get("Deployment", component)["spec"]["replicas"]
            found += [(component, f"{component}-{n}") for n in range(count if self.replicas else 1)]
        return found

    def _start_components(self) -> None:
        """The first certmanager first (the others join with it), then the rest side by
        side."""
        assert self.redis is not None
        certmanager_admin = ""
        for component, pod in self.pods():
            mounts = mounted_files(self.rendered, component, self.root / "pods" / pod, self.given)
            if component != "certmanager":  # the projected token, audience trellis
                token = self.kube.service_account_token("trellis-system", component)
                (mounts["/var/run/secrets/trellis"] / "token").write_text(token)
            env = environment(
                self.rendered, component, mounts, self.redis, certmanager_admin,
                self.kubeconfig, self.pod_ip, self.fixed_ports, pod, self.given,
            )  # fmt: skip
            process = ServiceProcess(
                component, MODULES[component], self.state_dir, self.redis.plain_url, env=env,
                join_token=False,
            )  # fmt: skip
            self.processes.append(process)
            prefix = "TRELLIS_" + component.upper().replace("-", "_") + "_"
            ports = (
                (int(env[prefix + "GRPC_PORT"]), int(env[prefix + "ADMIN_PORT"]))
                if self.fixed_ports
                else (0, 0)
            )
            process.spawn(ports)
            if not certmanager_admin:
                endpoint = process.wait_ready(60)
                certmanager_admin = endpoint.admin_url.removeprefix("https://")
        for process in self.processes[1:]:
            process.wait_ready(90)
        api = api_client(self.kubeconfig)
        try:  # each process's Pod, ready, its ports forwarded (the CLI's cluster mode)
            for process in self.processes:
                chartcluster.publish_pod(self.kube, api, self.rendered, process, self.pod_ip)
        finally:
            api.close()  # type: ignore[no-untyped-call]

    def process(self, component: str) -> ServiceProcess:
        """The (first) process of ``component``."""
        return next(p for p in self.processes if p.name == component)

    def stop(self) -> None:
        stop_together(reversed(self.processes))
        if self.redis is not None:
            self.redis.close()
