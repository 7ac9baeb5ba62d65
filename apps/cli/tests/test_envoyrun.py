"""``trellis envoy run``: the real Envoy that ``make bootstrap`` installed, exec'd as it is."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trellis_cli.proxyfolder import envoy_command
from trellis_common.bootstrap import SIDECAR_DRAIN_SECONDS
from trellis_common.envoybin import EnvoyNotFound, find_envoy

try:
    ENVOY = find_envoy()
except EnvoyNotFound:  # pragma: no cover - make bootstrap installs it
    ENVOY = ""

needs_envoy = pytest.mark.skipif(not ENVOY, reason="no envoy: run `make bootstrap`")


def trellis(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trellis_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@needs_envoy
def test_envoy_run_prints_the_real_envoys_version() -> None:
    done = trellis("envoy", "run", "--version")

    assert done.returncode == 0, done.stderr
    assert "version:" in done.stdout
    assert "/1.40.0/" in done.stdout


@needs_envoy
def test_envoys_exit_code_passes_through(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text("static_resources: {listeners: [{name: x}]}\n")

    done = trellis("envoy", "run", "--mode", "validate", "-c", str(config), "-l", "error")
    direct = subprocess.run(
        [ENVOY, "--mode", "validate", "-c", str(config), "-l", "error"],
        capture_output=True,
        timeout=60,
    )

    assert direct.returncode != 0
    assert done.returncode == direct.returncode


@needs_envoy
def test_arguments_after_a_double_dash_go_to_envoy() -> None:
    done = trellis("envoy", "run", "--", "--help")

    assert done.returncode == 0, done.stderr
    assert "--config-path" in done.stdout  # Envoy's help, not trellis'


def test_a_missing_envoy_is_2_and_names_make_bootstrap(tmp_path: Path) -> None:
    done = trellis("envoy", "run", "--version", env={"TRELLIS_ENVOY_BIN": str(tmp_path / "no")})

    assert done.returncode == 2
    assert "run `make bootstrap`" in done.stderr
    assert str(tmp_path / "no") in done.stderr
    assert "Traceback" not in done.stderr


def test_mesh_sidecars_drain_old_tcp_connections_within_seconds(tmp_path: Path) -> None:
    """A TCP policy change closes connections opened under the old rules when Envoy's
    drain ends: the sidecars `trellis vm bootstrap` and the demo start drain in seconds,
    not Envoy's default 600."""
    command = envoy_command(tmp_path / "envoy.yaml")
    drain = command.index("--drain-time-s")
    assert int(command[drain + 1]) == SIDECAR_DRAIN_SECONDS <= 10
    assert command[1:3] == ["-c", str(tmp_path / "envoy.yaml")]
