"""``trellis gateway run``: a Gateway's Envoy onboarded, connected to proxy-cp, supervised.

Real processes: the control plane with its injector, the CLI, and the Envoy it runs. The
gateway's Envoy is onboarded as ``trellis vm bootstrap`` onboards a sidecar, its node marked
a gateway; it connects to proxy-cp as ``bookstore/bookstore-gateway``; SIGTERM stops it and
its Envoy cleanly, and an Envoy that ends by itself ends the command with an error (its
supervisor starts it again).
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.gatewayrun import GatewayRun, alive
from trellis_testing import RedisServer
from trellis_testing.mesh import Mesh
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = "bookstore-gateway"


@pytest.fixture
def mesh(tmp_path: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec_dir / "bookstore")
    shutil.copytree(ROOT / "examples" / "gateway", spec_dir / "gateway")
    mesh = Mesh(tmp_path, state_dir, redis_server, spec_dir, injector=True)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()


@pytest.fixture
def gateway(mesh: Mesh, tmp_path: Path) -> Iterator[GatewayRun]:
    run = GatewayRun(mesh, tmp_path / "gateway", free_port())
    try:
        yield run
    finally:
        run.stop()


async def connected(mesh: Mesh, gateway: GatewayRun) -> str:
    """The gateway proxy's common name, once proxy-cp lists it connected."""

    def listed() -> str | None:
        assert gateway.process.poll() is None, gateway.output()
        names = [p["proxy"] for p in mesh.proxies()]
        return next((n for n in names if n.endswith(f".{GATEWAY}.bookstore")), None)

    await eventually(listed, timeout=60, interval=0.2, message="the gateway proxy connects")
    name = listed()
    assert name is not None
    return name


async def test_gateway_run_onboards_a_gateway_envoy_that_connects_and_stops_on_sigterm(
    mesh: Mesh, gateway: GatewayRun
) -> None:
    await connected(mesh, gateway)
    bootstrap = yaml.safe_load((gateway.out / "envoy.yaml").read_text())
    section = bootstrap["node"]["metadata"]["trellis"]
    assert section["gateway"] is True
    assert section["gateway_certs_dir"] == str((gateway.out / "certs").resolve())
    assert bootstrap["node"]["cluster"] == f"bookstore/{GATEWAY}"
    assert (gateway.out / "certs").is_dir()
    assert oct((gateway.out / "key.pem").stat().st_mode & 0o777) == "0o600"
    envoy = gateway.envoy_pid()
    assert envoy is not None
    assert alive(envoy)

    gateway.process.send_signal(signal.SIGTERM)
    assert gateway.process.wait(timeout=30) == 0, gateway.output()
    assert not alive(envoy)
    assert "gateway.stopped gateway=bookstore/bookstore-gateway" in gateway.output()


async def test_an_envoy_that_ends_by_itself_ends_gateway_run_with_an_error(
    mesh: Mesh, gateway: GatewayRun
) -> None:
    await connected(mesh, gateway)
    envoy = gateway.envoy_pid()
    assert envoy is not None
    os.kill(envoy, signal.SIGKILL)
    assert gateway.process.wait(timeout=30) == 2, gateway.output()
    assert "envoy of gateway bookstore/bookstore-gateway exited with code -9" in gateway.output()


def test_a_gateway_run_with_a_bad_certs_dir_names_the_option(mesh: Mesh, tmp_path: Path) -> None:
    done = mesh.trellis(
        *("gateway", "run", "-n", "bookstore", "--name", GATEWAY, "--out", str(tmp_path / "g")),
        *("--certs-dir", str(tmp_path / "with space")),
    )
    assert done.returncode == 2
    assert "--certs-dir" in done.stderr
    assert "plain names" in done.stderr
    assert not (tmp_path / "g").exists()
