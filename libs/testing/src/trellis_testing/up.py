"""``trellis up`` run as a user runs it, for tests: the CLI's own process, its log, its CLI.

:class:`Up` starts ``python -m trellis_cli.main --state-dir <tmp>/state up ...`` in a
session of its own (so :meth:`Up.stop` ends every process it started), waits for "Trellis
is up", and runs the CLI against the same state directory. The whole-mesh test (the
README's tour) and the HA test (``trellis up --ha``) use it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[5]


def wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout}s: {what}")


class Up:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.log = tmp / "up.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *args: str, env: Mapping[str, str] | None = None, timeout: float = 180) -> None:
        """``trellis up <args>``; returns once it says it is up (fails if it exits first)."""
        argv = [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(self.state)]
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [*argv, "up", *args],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
                env={**os.environ, "COLUMNS": "200", **(env or {})},
            )
        wait(lambda: "Trellis is up" in self.output() or self.exited(), timeout, "trellis up")
        assert not self.exited(), self.output()

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(self.state), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=ROOT,
        )

    def status(self) -> dict[str, dict[str, Any]]:
        """``trellis status --json``, by service and replica (empty if it said nothing)."""
        done = self.cli("status", "--json")
        body = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        return {s["service"]: s for s in body.get("services", [])}

    def pid(self, instance: str) -> int:
        return int(json.loads((self.state / "services" / f"{instance}.json").read_text())["pid"])

    def stop(self, stop_signal: signal.Signals = signal.SIGTERM, timeout: float = 90) -> None:
        """``stop_signal`` to ``trellis up`` (it stops what it started), then SIGKILL to
        its whole session if it has not ended within ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(stop_signal)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
