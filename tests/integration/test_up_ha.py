"""``trellis up --ha``: two of every component and Redis under Sentinel, as a user starts it.

Everything is a real process the CLI starts: three Redis servers and three sentinels, then
two processes of each service, each pair on one gRPC port. ``trellis status`` lists every
replica with its role; a leader SIGKILLed hands over to its standby; the services follow
a Redis failover by themselves.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("fixed-ports"),  # `trellis up` binds the default ports
]

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("certmanager", "endpoints-vm", "catalog", "proxy-cp", "injector")
ELECTED = ("certmanager", "endpoints-vm")


def wait(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting until {what}")


class Up:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / "state"
        self.log = tmp / "up.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *args: str) -> None:
        with self.log.open("wb") as sink:
            self.process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "trellis_cli.main", "--state-dir", str(self.state)),
                    *("up", "--no-demo", "--quiet", *args),
                ],
                stdout=sink,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                start_new_session=True,
                env={**os.environ, "COLUMNS": "200", "TRELLIS_LEASE_DURATION": "3",
                     "TRELLIS_LEASE_RENEW_DEADLINE": "2", "TRELLIS_LEASE_RETRY_PERIOD": "0.5"},
            )  # fmt: skip
        wait(lambda: "Trellis is up" in self.output() or self.exited(), 240, "trellis up is up")
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
        done = self.cli("status", "--json")
        body = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
        return {s["service"]: s for s in body.get("services", [])}

    def pid(self, instance: str) -> int:
        return int(json.loads((self.state / "services" / f"{instance}.json").read_text())["pid"])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = Up(tmp_path)
    try:
        running.start("--ha")
        yield running
    finally:
        running.stop()


def leaders(status: dict[str, dict[str, Any]], component: str) -> list[str]:
    return [
        name
        for name, service in status.items()
        if name in (component, f"{component}-2")
        and any(role.get("leading") for role in service.get("leadership", []))
    ]


def test_ha_runs_two_of_everything_and_a_leader_hands_over(up: Up) -> None:
    status = up.status()
    for component in COMPONENTS:
        for instance in (component, f"{component}-2"):
            assert status[instance]["healthy"], status[instance]
    for component in ELECTED:  # one leader, one standby, and the standby is ready
        assert len(leaders(status, component)) == 1, status
    shown = up.cli("status")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "standby (leader: " in shown.stdout

    # the Redis the services use is a Sentinel's, with two replicas of the master
    sentinel = redis.Redis(port=16390, username="admin", password=admin_password(up))
    master = sentinel.sentinel_get_master_addr_by_name("trellis")
    assert isinstance(master, tuple), master
    assert int(master[1]) in (16380, 16381, 16382)

    leader = leaders(status, "certmanager")[0]
    os.kill(up.pid(leader), signal.SIGKILL)  # the supervisor restarts it; the other leads
    wait(
        lambda: (now := leaders(up.status(), "certmanager")) and now != [leader],
        60,
        "the standby certmanager leads",
    )
    wait(lambda: all(s["healthy"] for s in up.status().values()), 60, "every replica healthy")


def admin_password(up: Up) -> str:
    return (up.state / "redis" / "users" / "admin").read_text().strip()
