"""Pytest fixtures shared by every package's tests (loaded by the root conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from trellis_common.testing.bell import Bell
from trellis_common.testing.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A real redis-server on a free port with AOF persistence in the test's tmp dir."""
    server = RedisServer(dir=tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A client that retries like a service's would: it rides over a Redis restart."""
    retry = Retry(ExponentialBackoff(cap=0.5, base=0.01), 8)
    client = redis.asyncio.Redis.from_url(redis_server.url, retry=retry)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
def bell() -> Bell:
    """Records the signals a manager sends (:class:`~trellis_common.testing.bell.Bell`)."""
    return Bell()
