"""The ``trellis`` CLI against the chart in a "cluster": the chart's processes
(``chartprocs``), their Pods in the test API server, reached only through a kubeconfig.

Each command runs as a real process with ``--kubeconfig`` and an empty ``--state-dir``, so
nothing local can answer: the CLI finds the pods by the chart's labels, port-forwards to
them through the API server (``kubeportforward``), reads the trust bundle and the admin
token from the cluster, and must answer as the same command does against the same
processes locally (``--state-dir`` of the processes). ``trellis check`` passes, then fails,
naming the check, once a component is stopped. One control plane for the module: each
start costs the suite about ten seconds.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chartprocs import ChartControlPlane
from tests.deploy.chartsidecar import onboard_sidecar
from tests.deploy.helmchart import render
from trellis_cli import check
from trellis_common import components
from trellis_testing.kube import KubeApi
from trellis_testing.waiting import eventually

# the first test also starts the control plane (about 45 s on a loaded 2-core machine), then
# runs the CLI a dozen times
pytestmark = [
    pytest.mark.integration,
    pytest.mark.xdist_group("cli-cluster"),
    pytest.mark.timeout(300),
]


class Plane:
    def __init__(self, plane: ChartControlPlane, kube: KubeApi, scratch: Path) -> None:
        self.plane, self.kube, self.scratch = plane, kube, scratch
        self.empty = scratch / "no-local-mesh"
        self.empty.mkdir()

    def run(self, *args: str, cluster: bool = True) -> subprocess.CompletedProcess[str]:
        """``trellis`` as a user runs it: in the cluster, or locally beside the processes."""
        env = {
            k: v for k, v in os.environ.items() if k not in ("TRELLIS_ADMIN_TOKEN", "KUBECONFIG")
        }
        env["HOME"] = str(self.scratch)  # no ~/.kube/config but the one given
        where = (
            ["--kubeconfig", str(self.plane.kubeconfig), "--state-dir", str(self.empty)]
            if cluster
            else ["--state-dir", str(self.plane.state_dir)]
        )
        return subprocess.run(
            [sys.executable, "-m", "trellis_cli.main", *where, *args],
            capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Plane]:
    scratch = tmp_path_factory.mktemp("cli-cluster")
    with KubeApi() as kube:
        rendered = render(scratch / "helm")
        control = ChartControlPlane(rendered, scratch / "plane", kube).start()
        try:
            yield Plane(control, kube, scratch)
        finally:
            control.stop()


def _json(done: subprocess.CompletedProcess[str], code: int = 0) -> Any:
    assert done.returncode == code, done.stderr
    return json.loads(done.stdout)


def test_read_commands_answer_in_the_cluster_as_they_do_locally(plane: Plane) -> None:
    for code, *args in (
        (0, "spec", "list", "-o", "json"),
        (0, "proxy", "list", "-o", "json"),
        # no such services: a negative answer (1), the same in both
        (1, "policy", "check", "--from", "shop/buyer", "--to", "shop/store", "--json"),
        (0, "certs", "list", "-o", "json"),
        (0, "identity", "list", "-o", "json"),
    ):
        cluster, local = plane.run(*args), plane.run(*args, cluster=False)
        assert _json(cluster, code) == _json(local, code), args
    in_cluster = plane.run("certs", "root")
    assert in_cluster.returncode == 0, in_cluster.stderr
    assert in_cluster.stdout == plane.run("certs", "root", cluster=False).stdout
    assert in_cluster.stdout.startswith("-----BEGIN CERTIFICATE-----")


def test_status_and_version_reach_every_component(plane: Plane) -> None:
    status = _json(plane.run("status", "-o", "json"))
    assert [s["healthy"] for s in status["services"]] == [True] * len(status["services"])
    # the summary is read with the cluster's admin token: answers, not refusals taken as data
    mesh = status["mesh"]
    assert mesh["connected_proxies"] == 0, mesh  # proxy-cp answered: none connect here
    assert mesh["catalog_revision"] is not None, mesh
    assert isinstance(mesh["invalid_documents"], int), mesh
    named = {s["service"] for s in status["services"]}
    assert set(components.COMPONENTS) <= named  # every component of the chart
    versions = yaml.safe_load(plane.run("version", "-o", "yaml").stdout)
    for component in ("certmanager", "catalog", "proxy-cp", "injector"):
        assert "version" in versions["components"][component], versions


def test_the_chart_ships_the_crds_check_expects(plane: Plane) -> None:
    shipped = {
        crd["metadata"]["name"]: [v["name"] for v in crd["spec"]["versions"] if v.get("storage")]
        for crd in plane.plane.rendered.all("CustomResourceDefinition")
    }
    assert {name: [version] for name, version in check.CHART_CRDS.items()} == shipped


def test_check_passes_then_names_a_stopped_component(plane: Plane) -> None:
    done = plane.run("check", "-o", "json")
    results = {c["check"]: c for c in json.loads(done.stdout)["checks"]}
    assert done.returncode == 0, done.stdout + done.stderr
    assert results["kubernetes-api"]["status"] == "ok"
    assert results["injector webhook"]["status"] == "ok", results["injector webhook"]
    assert results["redis"]["status"] == "ok"
    assert results["component catalog"]["detail"] == "1/1 ready"
    # Gateway API and Istio are prerequisites the default install does not ship: warnings
    assert results["crd serviceentries.networking.istio.io"]["status"] == "warn"
    table = plane.run("check")
    assert "component proxy-cp" in table.stdout
    assert table.returncode == 0

    # locally (the processes' state directory), the checks that apply to a local mesh
    local = plane.run("check", "-o", "json", cluster=False)
    failing = [c for c in json.loads(local.stdout)["checks"] if c["status"] == "fail"]
    assert local.returncode == 0, failing
    names = [c["check"] for c in json.loads(local.stdout)["checks"]]
    assert "component certmanager" in names
    assert "redis" in names
    assert not [n for n in names if n.startswith(("crd ", "kubernetes-api", "injector webhook"))]

    plane.plane.process("endpoints-vm").stop()
    done = plane.run("check")
    assert done.returncode == 1, done.stdout
    failed = [line for line in done.stdout.splitlines() if "FAIL" in line]
    # the catalog may fail too: it reads endpoints-vm's registry and says so
    [line] = [line for line in failed if "component endpoints-vm" in line]
    assert "endpoints-vm-0 unreachable" in line
    assert all("component" in line for line in failed), failed


def test_proxy_config_reads_a_connected_proxy_through_the_cluster(
    plane: Plane, tmp_path: Path
) -> None:
    """A real Envoy sidecar connected to the chart's proxy-cp: ``proxy list`` finds it and
    ``proxy config`` answers with what proxy-cp sent it, as locally, keys redacted."""
    proxy = onboard_sidecar(plane.plane, "shop", "buyer", tmp_path)
    try:

        def listed() -> list[str]:
            done = plane.run("proxy", "list", "-o", "json")
            return [
                p["proxy"] for p in _json(done)["proxies"] if p["proxy"].endswith(".buyer.shop")
            ]

        [name] = asyncio.run(eventually(listed, timeout=60, message="the sidecar connects"))
        cluster = _json(plane.run("proxy", "config", name, "--json"))
        assert cluster == _json(plane.run("proxy", "config", name, "--json", cluster=False))
        assert cluster["proxy"] == name
        assert cluster["resources"]["lds"], cluster  # its outbound listener, at least
        assert "PRIVATE KEY" not in json.dumps(cluster)
        # a proxy that is not there is refused, naming it
        missing = plane.run("proxy", "config", "nobody.nothing.shop")
        assert missing.returncode != 0
        assert "nobody.nothing.shop" in missing.stderr
    finally:
        proxy.envoy.stop()
