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

The HA rendering (``ha.enabled``) runs the same way with as many processes per component
as the chart renders replicas, each with its pod's name, against a real Redis under
Sentinel that has the chart's users and passwords (the components find the master through
the Sentinels, logging in to them as to Redis), and the leader-elected components elect
their leader on the Lease the chart's RBAC names.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from tests.deploy.chartprocs import MODULES, ChartControlPlane, chart_acl
from tests.deploy.helmchart import render
from trellis_kube.client import api_client
from trellis_testing import RedisServer
from trellis_testing.kube import KubeApi
from trellis_testing.redis_sentinel import SentinelRedis
from trellis_testing.services import ServiceProcess
from trellis_testing.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def kube() -> Iterator[KubeApi]:
    with KubeApi() as api:
        yield api


async def meshconfig_read(catalog: ServiceProcess) -> None:
    source = "k8s:v1/ConfigMap/trellis-system/trellis-mesh-config"

    def read() -> bool:
        resources = catalog.get("/v1/resources").json()["resources"]
        return any(r.get("source") == source and r["state"] == "valid" for r in resources)

    await eventually(read, timeout=20, message="the MeshConfig ConfigMap read")


def test_the_rendered_pods_start_join_and_become_ready(tmp_path: Path, kube: KubeApi) -> None:
    rendered = render(tmp_path / "helm")
    plane = ChartControlPlane(rendered, tmp_path, kube).start()
    try:
        assert isinstance(plane.redis, RedisServer)
        # Redis runs the aclfile the chart's script (files/redis-acl.sh) wrote
        acl = chart_acl(rendered, plane.redis.users_dir, tmp_path / "acl")["users.acl"]
        assert plane.redis.aclfile.read_text() == acl.read_text()
        processes = plane.processes
        assert [p.name for p in processes] == list(MODULES)
        for process in processes[1:]:
            assert f"join.done component={process.name}" in process.logs()
        certmanager = processes[0]
        metrics = certmanager.get("/metrics").text
        for process in processes[1:]:
            assert f'component="{process.name}",via="join"' in metrics
        assert (plane.state_dir / "trust-bundle.pem").read_bytes() == rendered.secret("trellis-ca")[
            "tls.crt"
        ]
        asyncio.run(meshconfig_read(processes[1]))
        # Prometheus without the mesh CA: each pod's plain-HTTP /metrics (metrics.port),
        # where the pod's annotations point
        for process in processes:
            port = process.env["TRELLIS_METRICS_PORT"]
            scraped = httpx.get(f"http://{plane.pod_ip}:{port}/metrics", timeout=10)
            assert scraped.status_code == 200, process.name
            assert f'trellis_build_info{{component="{process.name}"' in scraped.text
    finally:
        plane.stop()


#: The components that elect a leader on the Lease trellis-<component> (the chart's RBAC).
LEADER_ELECTED = ("certmanager", "endpoints-vm")


async def leases_held(plane: ChartControlPlane) -> dict[str, str]:
    """Lease name -> its holder, once every leader-elected component has one."""
    leases: Any = client.CoordinationV1Api(api_client(plane.kubeconfig))
    held: dict[str, str] = {}

    def read() -> bool:
        for item in leases.list_namespaced_lease("trellis-system").items:
            held[item.metadata.name] = item.spec.holder_identity or ""
        return all(held.get(f"trellis-{c}") for c in LEADER_ELECTED)

    await eventually(read, timeout=30, message="a leader on every component's Lease")
    return held


async def one_leader(plane: ChartControlPlane, component: str) -> dict[str, str]:
    """Each replica's role in its component's election, once one leads and all are ready."""
    roles: dict[str, str] = {}

    def read() -> bool:
        for process in plane.processes:
            if process.name == component:
                answer = process.get("/readyz")
                if answer.status_code != 200:
                    return False
                roles[process.instance] = answer.json().get("roles", {}).get(component, "")
        return sorted(roles.values()) == ["leader", "standby"]

    await eventually(read, timeout=30, message=f"one {component} leading, one standing by")
    return roles


def test_the_ha_rendering_runs_replicas_under_sentinel_and_elects_leaders(
    tmp_path: Path, kube: KubeApi
) -> None:
    rendered = render(tmp_path / "helm", "ha.enabled=true")
    plane = ChartControlPlane(rendered, tmp_path, kube, replicas=True).start()
    try:
        assert isinstance(plane.redis, SentinelRedis)
        acl = chart_acl(rendered, plane.redis.users_dir, tmp_path / "acl")["users.acl"]
        assert all(node.aclfile.read_text() == acl.read_text() for node in plane.redis.nodes)
        # two of each, by their pods' names, each its own record in the registry
        assert [p.instance for p in plane.processes] == [
            f"{component}-{n}" for component in MODULES for n in (0, 1)
        ]
        for process in plane.processes[1:]:
            if process.name != "certmanager":
                assert f"join.done component={process.name}" in process.logs()
        held = asyncio.run(leases_held(plane))
        for component in LEADER_ELECTED:  # one of its replicas, by its pod's name
            assert held[f"trellis-{component}"] in {f"{component}-0", f"{component}-1"}
            roles = asyncio.run(one_leader(plane, component))
            # the Lease's holder leads; the other is a standby, and ready
            assert roles == {
                f"{component}-{n}": "leader" if held[f"trellis-{component}"] == f"{component}-{n}"
                else "standby" for n in (0, 1)
            }  # fmt: skip
        asyncio.run(meshconfig_read(plane.process("catalog")))
    finally:
        plane.stop()
