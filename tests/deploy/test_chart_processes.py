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

import pytest

from tests.deploy.chartprocs import MODULES, ChartControlPlane
from tests.deploy.helmchart import render
from trellis_common.testing.kube import KubeApi
from trellis_common.testing.services import ServiceProcess
from trellis_common.testing.waiting import eventually

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
        assert plane.redis is not None
        assert (
            plane.redis.aclfile.read_text()
            == rendered.secret("trellis-redis-acl")["users.acl"].decode()
        )
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
    finally:
        plane.stop()
