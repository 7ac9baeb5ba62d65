"""The Redis `trellis up` starts: persistent, and configured to rewrite its AOF."""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from trellis_cli.up import redis_spec
from trellis_common.testing.redis_server import free_port
from trellis_common.testing.waiting import eventually


@pytest.fixture
def up_redis(tmp_path: Path) -> Iterator[redis.Redis]:
    """The redis-server of ``trellis up``, run from its own argv on a free port."""
    port = free_port()
    spec = redis_spec(tmp_path, port=port)
    process = subprocess.Popen(
        list(spec.argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    client = redis.Redis(port=port)
    try:
        yield client
    finally:
        client.close()
        process.kill()
        process.wait()


async def test_the_local_redis_persists_every_write_and_rewrites_its_aof(
    up_redis: redis.Redis, tmp_path: Path
) -> None:
    def answers() -> bool:
        try:
            return bool(up_redis.ping())
        except redis.ConnectionError:
            return False

    await eventually(answers, timeout=10)
    config = {
        name: up_redis.config_get(name)[name]
        for name in (
            "appendonly",
            "appendfsync",
            "auto-aof-rewrite-percentage",
            "auto-aof-rewrite-min-size",
            "dir",
        )
    }
    assert config == {
        "appendonly": "yes",
        "appendfsync": "always",
        "auto-aof-rewrite-percentage": "100",
        "auto-aof-rewrite-min-size": str(64 * 1024 * 1024),
        "dir": str((tmp_path / "redis").resolve()),
    }


@pytest.mark.parametrize("before", [None, 0o755], ids=["new", "made-by-an-older-version"])
def test_the_redis_data_directory_is_0700(tmp_path: Path, before: int | None) -> None:
    data = tmp_path / "redis"
    if before is not None:
        data.mkdir(mode=before)
        data.chmod(before)
    spec = redis_spec(tmp_path, port=free_port())
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert str(data.resolve()) in spec.argv
