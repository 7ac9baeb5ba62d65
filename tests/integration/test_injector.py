"""Onboarding a VM's proxy with `trellis vm bootstrap`, then running it against proxy-cp.

Everything is real: Redis, certmanager, the catalog, proxy-cp and the injector as
processes, the CLI as a subprocess, and an Envoy 1.40 started with the bootstrap the CLI
wrote, as a user would start it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from trellis_testing import RedisServer, eventually
from trellis_testing.envoy import find_envoy
from trellis_testing.ports import free_port
from trellis_testing.services import ServiceProcess, start_mesh, stop_together

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FAST = {"TRELLIS_REGISTRY_TTL": "2"}


class Mesh:
    def __init__(self, tmp: Path, state_dir: Path, redis: RedisServer) -> None:
        spec_dir = tmp / "spec"
        shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
        self.state_dir = state_dir

        def process(name: str, module: str, *args: str, **env: str) -> ServiceProcess:
            return ServiceProcess(name, module, state_dir, redis, args=args, env={**FAST, **env})

        self.processes = {
            "certmanager": process("certmanager", "trellis_certmanager.main"),
            "catalog": process(
                "catalog",
                "trellis_catalog.main",
                "--spec-dir",
                str(spec_dir),
                TRELLIS_CATALOG_SPEC_POLL_INTERVAL="0.1",
                TRELLIS_CATALOG_DISCOVERY_INTERVAL="0.2",
            ),
            "proxy-cp": process("proxy-cp", "trellis_proxy_cp.main", "--xds-host", "127.0.0.1"),
            "injector": process("injector", "trellis_injector.main"),
        }

    def start(self) -> None:
        start_mesh(self.processes.values())

    def stop(self) -> None:
        stop_together(reversed(list(self.processes.values())))

    def get(self, service: str, path: str) -> Any:
        return self.processes[service].get(path).json()

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(self.state_dir), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture
def mesh(tmp_path: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    mesh = Mesh(tmp_path, state_dir, redis_server)
    try:
        mesh.start()
        yield mesh
    finally:
        mesh.stop()


def bootstrap_args(out: Path, admin: int, *extra: str) -> list[str]:
    return [
        "vm",
        "bootstrap",
        "-n",
        "bookbuyer",
        "--service",
        "bookbuyer",
        "--app-port",
        "0",
        "--inbound-port",
        str(free_port()),
        "--outbound-port",
        str(free_port()),
        "--admin-port",
        str(admin),
        "--out",
        str(out),
        *extra,
    ]


def test_a_vm_proxy_onboarded_with_the_cli_connects(mesh: Mesh, tmp_path: Path) -> None:
    out = tmp_path / "vm" / "bookbuyer-proxy"
    admin = free_port()
    done = mesh.cli(*bootstrap_args(out, admin))
    assert done.returncode == 0, done.stdout + done.stderr

    # the files, the key readable by its owner only
    config = yaml.safe_load((out / "envoy.yaml").read_text())
    common_name = config["node"]["id"]
    assert common_name.endswith(".bookbuyer.bookbuyer")
    assert common_name in done.stdout
    assert "--disable-hot-restart" in done.stdout
    assert "trellis vm register" in done.stdout
    assert "PRIVATE KEY" not in done.stdout + done.stderr
    key = out / "key.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert "BEGIN PRIVATE KEY" in key.read_text()
    assert "BEGIN CERTIFICATE" in (out / "cert.pem").read_text()
    assert "BEGIN CERTIFICATE" in (out / "ca.pem").read_text()
    # Envoy takes its client certificate from the SDS file, which renewal swaps
    tls = config["static_resources"]["clusters"][0]["transport_socket"]["typed_config"]
    [sds] = tls["common_tls_context"]["tls_certificate_sds_secret_configs"]
    sds_file = out.resolve() / "proxy-sds.yaml"
    assert sds["sds_config"]["path_config_source"]["path"] == str(sds_file)
    [secret] = yaml.safe_load(sds_file.read_text())["resources"]
    assert secret["tls_certificate"]["private_key"] == {"filename": str(out.resolve() / "key.pem")}
    assert "PRIVATE KEY" not in mesh.processes["injector"].logs()

    # the catalog expects it before it ever connects
    proxies = {p["common_name"]: p for p in mesh.get("catalog", "/v1/proxies")["proxies"]}
    assert proxies[common_name]["expected"] is True
    assert proxies[common_name]["service_account"] == "bookbuyer"

    # Envoy, started as the CLI said, joins the mesh
    def connected() -> bool:
        listed = mesh.get("proxy-cp", "/v1/proxies")["proxies"]
        return any(p["proxy"] == common_name for p in listed)

    log = tmp_path / "envoy.log"
    with log.open("wb") as sink:
        envoy = subprocess.Popen(
            [
                find_envoy(),
                "-c",
                str(out / "envoy.yaml"),
                "--disable-hot-restart",
                "--base-id",
                str(random.randrange(1000, 60000)),
                "--concurrency",
                "1",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        try:
            asyncio.run(
                eventually(connected, timeout=15, interval=0.2, message="proxy-cp lists the proxy")
            )
        except AssertionError as exc:
            envoy_log = log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"{exc}; envoy's log:\n{envoy_log}") from None
        stats = httpx.get(
            f"http://127.0.0.1:{admin}/stats?filter=control_plane.connected_state", timeout=5
        )
        assert "control_plane.connected_state: 1" in stats.text
    finally:
        envoy.terminate()
        try:
            envoy.wait(10)
        except subprocess.TimeoutExpired:
            envoy.kill()
            envoy.wait()


def test_json_output_and_outages(mesh: Mesh, tmp_path: Path) -> None:
    out = tmp_path / "delta-proxy"
    done = mesh.cli(*bootstrap_args(out, free_port(), "--protocol", "delta", "--json"))
    assert done.returncode == 0, done.stderr
    assert "PRIVATE KEY" not in done.stdout
    result = json.loads(done.stdout)
    assert result["bootstrap"]["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert result["files"]["key"] == str(out.resolve() / "key.pem")
    assert result["envoy_command"][1:] == [
        "-c",
        str(out.resolve() / "envoy.yaml"),
        "--disable-hot-restart",
        "--drain-time-s",
        "5",  # a TCP policy change closes old connections within seconds
    ]
    assert os.path.exists(result["files"]["key"])

    # invalid: named by field
    clash = mesh.cli(
        "vm",
        "bootstrap",
        "-n",
        "bookbuyer",
        "--service",
        "bookbuyer",
        "--app-port",
        "0",
        "--inbound-port",
        "15003",
        "--outbound-port",
        "15003",
        "--admin-port",
        "15000",
        "--out",
        str(tmp_path / "clash"),
    )
    assert clash.returncode == 2  # refused as malformed: a usage error
    assert "422" in clash.stderr, clash.stderr
    assert "outbound_port" in clash.stderr
    assert not (tmp_path / "clash").exists()

    # certmanager down: 503 naming it, nothing written
    mesh.processes["certmanager"].stop()
    down = mesh.cli(*bootstrap_args(tmp_path / "later", free_port()))
    assert down.returncode == 2
    assert "503" in down.stderr, down.stderr
    assert "certmanager" in down.stderr
    assert not (tmp_path / "later").exists()
