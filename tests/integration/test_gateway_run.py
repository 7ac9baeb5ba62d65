"""``trellis gateway run``: a Gateway's Envoy onboarded, connected to proxy-cp, supervised.

Real processes: the control plane with its injector, the CLI, and the Envoy it runs. The
gateway's Envoy is onboarded as ``trellis vm bootstrap`` onboards a sidecar, its node marked
a gateway; it connects to proxy-cp as ``bookstore/bookstore-gateway``; SIGTERM stops it and
its Envoy cleanly, and an Envoy that ends by itself ends the command with an error (its
supervisor starts it again).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from trellis_common.testing import RedisServer
from trellis_common.testing.mesh import Mesh
from trellis_common.testing.ports import free_port
from trellis_common.testing.waiting import eventually

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


class GatewayRun:
    """``trellis gateway run`` as its own process, its output in a file."""

    def __init__(self, mesh: Mesh, out: Path, admin_port: int) -> None:
        self.out = out
        self.admin_port = admin_port
        self.log = out.parent / f"{out.name}.log"
        argv = [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(mesh.state_dir)]
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [
                    *argv,
                    *("gateway", "run", "-n", "bookstore", "--name", GATEWAY),
                    *("--admin-port", str(admin_port), "--out", str(out)),
                    *("--envoy-arg=--log-level", "--envoy-arg=warning", "--grace", "5"),
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "TRELLIS_ENVOY_LOG_LEVEL": "warning"},
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def envoy_pid(self) -> int | None:
        found = re.search(r"gateway\.started .*envoy_pid=(\d+)", self.output())
        return int(found.group(1)) if found else None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        pid = self.envoy_pid()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it has ended, its parent not yet told)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


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
