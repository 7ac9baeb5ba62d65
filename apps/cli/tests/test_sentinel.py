"""The Redis set of ``trellis up --redis-sentinel``: run from its own argv, it serves its
URL to a component's user, replicates, keeps its secrets off the command line, and a
second start keeps the roles a failover wrote."""

from __future__ import annotations

import asyncio
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from trellis_cli import sentinel
from trellis_cli.supervisor import ProcessSpec
from trellis_runtime import redisconn
from trellis_runtime.redisconn import RedisTarget
from trellis_testing.ports import free_port


def specs_on_free_ports(state_dir: Path) -> tuple[list[ProcessSpec], str]:
    return sentinel.sentinel_specs(
        state_dir,
        redis_ports=tuple(free_port() for _ in range(3)),
        sentinel_ports=tuple(free_port() for _ in range(3)),
    )


@pytest.fixture
def running_set(tmp_path: Path) -> Iterator[str]:
    """The set's processes, started from their argv; the URL."""
    specs, url = specs_on_free_ports(tmp_path)
    processes = [
        subprocess.Popen(list(spec.argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for spec in specs
    ]
    try:
        yield url
    finally:
        for process in processes:
            process.kill()
            process.wait()


@pytest.mark.slow
async def test_the_set_serves_its_url_to_a_component_and_replicates_to_both_replicas(
    running_set: str, tmp_path: Path
) -> None:
    users = tmp_path / "redis" / "users"
    target = RedisTarget.create(running_set, "endpoints-vm", users / "endpoints-vm")
    client = redisconn.connect(target)
    try:
        await asyncio.wait_for(redisconn.wait_for_redis(client, asyncio.Event()), 20)
        await client.hset("trellis:endpoints-vm:workloads", "vm-1", "registered")
        acked = 0
        while acked < 2:  # the replicas may still be on their first sync
            try:
                acked = await redisconn.replicated(client, replicas=2, timeout_ms=500)
            except redisconn.NotReplicated:
                continue
        assert acked == 2
    finally:
        await client.aclose()


def test_secrets_stay_in_private_files_off_the_command_line(tmp_path: Path) -> None:
    specs, url = specs_on_free_ports(tmp_path)
    passwords = [p.read_text().strip() for p in (tmp_path / "redis" / "users").iterdir()]
    base = tmp_path / sentinel.DIRECTORY

    assert url.startswith("redis+sentinel://127.0.0.1:")
    assert url.endswith("/trellis/0")
    assert [s.name for s in specs] == [
        *(f"redis-{n}" for n in range(3)),
        *(f"sentinel-{n}" for n in range(3)),
    ]
    for spec in specs:
        assert not any(p in arg for p in passwords for arg in spec.argv)
    for name in ("redis-0/redis.conf", "redis-1/users.acl", "sentinel-2/sentinel.conf"):
        assert stat.S_IMODE((base / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(base.stat().st_mode) == 0o700
    assert "replicaof" not in (base / "redis-0" / "redis.conf").read_text()
    assert "replicaof 127.0.0.1" in (base / "redis-1" / "redis.conf").read_text()


def test_a_second_start_keeps_the_roles_and_takes_new_passwords(tmp_path: Path) -> None:
    sentinel.sentinel_specs(tmp_path)  # the default ports: nothing is started
    config = tmp_path / sentinel.DIRECTORY / "redis-0" / "redis.conf"
    # what a failover leaves: the sentinels made redis-0 a replica of redis-1
    config.write_text(config.read_text() + "replicaof 127.0.0.1 16381\n")
    (tmp_path / "redis" / "users" / "replication").unlink()  # rotated at the next start

    sentinel.sentinel_specs(tmp_path)

    text = config.read_text()
    new = (tmp_path / "redis" / "users" / "replication").read_text().strip()
    assert "replicaof 127.0.0.1 16381" in text
    assert [line for line in text.splitlines() if line.startswith("masterauth")] == [
        f"masterauth {new}"
    ]
