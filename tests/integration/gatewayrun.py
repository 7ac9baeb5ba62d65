"""``trellis gateway run`` as a test's own process (tests/integration/test_gateway_*.py)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from trellis_testing import RedisServer
from trellis_testing.mesh import Mesh


class GatewayRun:
    """``trellis gateway run`` as its own process, its output in a file."""

    def __init__(
        self,
        mesh: Mesh,
        out: Path,
        admin_port: int,
        namespace: str = "bookstore",
        name: str = "bookstore-gateway",
    ) -> None:
        self.out = out
        self.admin_port = admin_port
        self.log = out.parent / f"{out.name}.log"
        argv = [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(mesh.state_dir)]
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [
                    *argv,
                    *("gateway", "run", "-n", namespace, "--name", name),
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


@contextlib.contextmanager
def spec_mesh(tmp_path: Path, state_dir: Path, redis: RedisServer, spec: str) -> Iterator[Mesh]:
    """The control plane with its injector, on a spec directory of one file, ``spec``."""
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "gateway.yaml").write_text(spec)
    mesh = Mesh(tmp_path, state_dir, redis, spec_dir, injector=True)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()
