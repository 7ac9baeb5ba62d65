"""``trellis up --ha``: two of every component and Redis under Sentinel, as a user starts it.

Everything is a real process the CLI starts: three Redis servers and three sentinels, then
two processes of each service, each pair on one gRPC port. ``trellis status`` lists every
replica with its role; a leader SIGKILLed hands over to its standby; the services follow
a Redis failover by themselves.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from trellis_testing.up import Up, wait

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("fixed-ports"),  # `trellis up` binds the default ports
]

COMPONENTS = ("certmanager", "endpoints-vm", "catalog", "proxy-cp", "injector")
ELECTED = ("certmanager", "endpoints-vm")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    running = Up(tmp_path)
    try:
        # leases of 3 s: a leader killed is replaced within seconds
        lease = {"TRELLIS_LEASE_DURATION": "3", "TRELLIS_LEASE_RENEW_DEADLINE": "2"}
        lease["TRELLIS_LEASE_RETRY_PERIOD"] = "0.5"
        running.start("--ha", "--no-demo", "--quiet", env=lease, timeout=240)
        yield running
    finally:
        running.stop(signal.SIGINT, timeout=60)


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

    # the leader freezes (SIGSTOP: it cannot renew, as if cut off): the standby takes over
    # once the lease has run out, and the old one, thawed, has stepped down
    leader = leaders(status, "certmanager")[0]
    pid = up.pid(leader)
    os.kill(pid, signal.SIGSTOP)
    try:
        wait(
            lambda: (now := leaders(up.status(), "certmanager")) and now != [leader],
            60,
            "the standby certmanager leads",
        )
    finally:
        os.kill(pid, signal.SIGCONT)
    wait(lambda: all(s["healthy"] for s in up.status().values()), 60, "every replica healthy")
    assert len(leaders(up.status(), "certmanager")) == 1

    # a leader SIGKILLed: the supervisor restarts it, and one replica leads throughout
    os.kill(up.pid(leaders(up.status(), "endpoints-vm")[0]), signal.SIGKILL)
    wait(lambda: all(s["healthy"] for s in up.status().values()), 60, "every replica healthy")
    assert len(leaders(up.status(), "endpoints-vm")) == 1

    # the Redis master stops answering (SIGSTOP: a killed one is restarted by `trellis up`
    # faster than the sentinels' 1 s): a replica is promoted, the old master demoted when it
    # is back, and the services go on by themselves
    frozen = redis_pid(up, int(master[1]))
    os.kill(frozen, signal.SIGSTOP)
    try:
        wait(lambda: promoted(sentinel, int(master[1])), 60, "a replica promoted")
    finally:
        os.kill(frozen, signal.SIGCONT)

    # a write that met the frozen master was refused (503, "retry once Redis is back"), not
    # lost: an agent retries it, and it is taken once the client has found the new master
    def register() -> bool:
        done = up.cli(
            "vm", "register", "-n", "shop", "--name", "vm-1", "--service", "cart",
            "--address", "10.0.0.1", "--port", "http=8080",
        )  # fmt: skip
        assert done.returncode == 0 or "Redis is unavailable" in done.stderr, done.stderr
        return done.returncode == 0

    wait(register, 60, "a registration taken after the failover")
    wait(lambda: all(s["healthy"] for s in up.status().values()), 60, "healthy after failover")
    listed = up.cli("vm", "list", "--json")
    assert "vm-1" in listed.stdout, listed.stdout + listed.stderr


def redis_pid(up: Up, port: int) -> int:
    """The pid of the Redis server on ``port``, as it says itself."""
    with redis.Redis(port=port, username="admin", password=admin_password(up)) as server:
        return int(server.info("server")["process_id"])


def promoted(sentinel: redis.Redis, old_port: int) -> bool:
    try:
        master = sentinel.sentinel_get_master_addr_by_name("trellis")
    except redis.RedisError:
        return False
    return isinstance(master, tuple) and int(master[1]) != old_port


def admin_password(up: Up) -> str:
    return (up.state / "redis" / "users" / "admin").read_text().strip()
