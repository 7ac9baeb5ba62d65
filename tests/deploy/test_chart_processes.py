"""The chart's pods, run as processes with exactly the environment and files it renders.

There is no cluster here, so each Deployment's container is started as a local process:
its ``env`` as ``helm template`` renders it, its Secret volumes written as the files the
mounts would hold, its projected ServiceAccount token issued by the test API server (which
also answers certmanager's TokenReviews), and Redis started with the chart's ACL users and
passwords. What a cluster would change is remapped and only that: the pod IP becomes
127.0.0.1, Service names the local addresses, mount paths a temporary directory, ports free
ones, and in-cluster config a kubeconfig for the test API server.

So this checks that the rendered wiring really starts the control plane: certmanager signs
with the chart's CA, every other component joins with its ServiceAccount token (no join
token anywhere), logs in to Redis as its own ACL user, and becomes ready; the catalog reads
the rendered MeshConfig ConfigMap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.deploy.helmchart import Rendered, render
from trellis_common.kube.client import api_client
from trellis_common.testing import RedisServer
from trellis_common.testing.kube import KubeApi
from trellis_common.testing.redis_backend import redis_server
from trellis_common.testing.services import ServiceProcess
from trellis_common.testing.waiting import eventually

pytestmark = pytest.mark.integration

MODULES = {
    "certmanager": "trellis_certmanager.main",
    "catalog": "trellis_catalog.main",
    "endpoints-k8s": "trellis_endpoints_k8s.main",
    "endpoints-vm": "trellis_endpoints_vm.main",
    "proxy-cp": "trellis_proxy_cp.main",
    "injector": "trellis_injector.main",
}
#: Components that call the Kubernetes API (in a pod: in-cluster config).
KUBE = ("certmanager", "catalog", "endpoints-k8s", "injector")


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    with KubeApi() as api:
        yield api


def mounted_files(rendered: Rendered, component: str, root: Path) -> dict[str, Path]:
    """Write what the pod's Secret volumes hold under ``root``; mount path -> local dir."""
    pod = rendered.pod(component)
    volumes = {v["name"]: v for v in pod["volumes"]}
    where = {}
    for mount in rendered.container(component)["volumeMounts"]:
        local = root / component / mount["name"]
        local.mkdir(parents=True)
        secret = volumes[mount["name"]].get("secret")
        if secret is not None:
            data = rendered.secret(secret["secretName"])
            for item in secret["items"]:
                path = local / item["path"]
                path.write_bytes(data[item["key"]])
                path.chmod(0o600)
        where[mount["mountPath"]] = local
    return where


def environment(
    rendered: Rendered, component: str, mounts: dict[str, Path], redis: RedisServer,
    certmanager_admin: str, kubeconfig: Path,
) -> dict[str, str]:  # fmt: skip
    """The container's env, with only what a cluster provides remapped (module docstring)."""
    token = rendered.secret("trellis-admin-token")["token"].decode()
    env = {}
    for item in rendered.container(component)["env"]:
        name, value = item["name"], item.get("value")
        if value is None:
            source = item["valueFrom"]
            value = token if "secretKeyRef" in source else "127.0.0.1"
        value = value.replace("$(POD_IP)", "127.0.0.1").replace("$(POD_NAME)", "proxy-cp-0")
        for mount, local in mounts.items():
            if value.startswith(mount + "/"):
                value = str(local) + value.removeprefix(mount)
        env[name] = value
    env["TRELLIS_REDIS_URL"] = redis.plain_url  # the Service trellis-redis
    if "TRELLIS_CERTMANAGER_ADMIN_ADDRESS" in env:  # the Service certmanager
        env["TRELLIS_CERTMANAGER_ADMIN_ADDRESS"] = certmanager_admin
    if component == "injector":
        env["TRELLIS_INJECTOR_WEBHOOK_PORT"] = "0"  # tests run side by side
    if component == "proxy-cp":
        env["TRELLIS_PROXY_CP_DESTINATION_PORT"] = "0"
    if component in KUBE:
        prefix = "TRELLIS_" + component.upper().replace("-", "_") + "_"
        env[prefix + "KUBECONFIG"] = str(kubeconfig)
    del env["TRELLIS_STATE_DIR"]  # the process's own (ServiceProcess sets one)
    return env


async def meshconfig_read(catalog: ServiceProcess) -> None:
    source = "k8s:v1/ConfigMap/trellis-system/trellis-mesh-config"

    def read() -> bool:
        resources = catalog.get("/v1/resources").json()["resources"]
        return any(r.get("source") == source and r["state"] == "valid" for r in resources)

    await eventually(read, timeout=20, message="the MeshConfig ConfigMap read")


def test_the_rendered_pods_start_join_and_become_ready(tmp_path: Path, kube: KubeApi) -> None:
    rendered = render(tmp_path / "helm")
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    passwords = rendered.secret("trellis-redis-users")
    redis = redis_server(tmp_path / "redis")
    redis.users_dir.mkdir(parents=True, mode=0o700)
    for user, password in passwords.items():  # the chart's passwords, not made anew
        redis.password_file(user).write_bytes(password)
        redis.password_file(user).chmod(0o600)
    redis.start()
    kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
    api: Any = api_client(kubeconfig)
    core: Any = client.CoreV1Api(api)
    core.create_namespace({"metadata": {"name": "trellis-system"}})
    configmap = rendered.get("ConfigMap", "trellis-mesh-config")
    core.create_namespaced_config_map("trellis-system", configmap)
    processes: list[ServiceProcess] = []
    try:
        assert (
            redis.aclfile.read_text() == rendered.secret("trellis-redis-acl")["users.acl"].decode()
        )
        certmanager_admin = ""
        for component, module in MODULES.items():
            mounts = mounted_files(rendered, component, tmp_path / "pods")
            if component != "certmanager":  # the projected token, audience trellis
                token = kube.service_account_token("trellis-system", component)
                (mounts["/var/run/secrets/trellis"] / "token").write_text(token)
            env = environment(rendered, component, mounts, redis, certmanager_admin, kubeconfig)
            process = ServiceProcess(component, module, state_dir, redis, env=env, join_token=False)
            endpoint = process.start(timeout=60)
            processes.append(process)
            if component == "certmanager":
                certmanager_admin = endpoint.admin_url.removeprefix("https://")
        for process in processes[1:]:
            assert f"join.done component={process.name}" in process.logs()
        certmanager = processes[0]
        metrics = certmanager.get("/metrics").text
        for process in processes[1:]:
            assert f'component="{process.name}",via="join"' in metrics
        assert (state_dir / "trust-bundle.pem").read_bytes() == rendered.secret("trellis-ca")[
            "tls.crt"
        ]
        asyncio.run(meshconfig_read(processes[1]))
    finally:
        for process in reversed(processes):
            process.stop()
        redis.close()
