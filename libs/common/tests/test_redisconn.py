"""Waiting for Redis at start-up: retry quietly until it answers or the service stops."""

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from redis.exceptions import TimeoutError as RedisTimeoutError

from trellis_common.redisconn import connect, wait_for_redis
from trellis_common.testing import RedisServer, eventually
from trellis_common.testing.redis_server import free_port


@pytest.fixture
async def unreachable() -> AsyncIterator[redis.asyncio.Redis]:
    """A client for a port nothing listens on."""
    client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0")
    try:
        yield client
    finally:
        await client.aclose()


async def test_returns_at_once_when_stop_is_already_set(
    unreachable: redis.asyncio.Redis,
) -> None:
    stop = asyncio.Event()
    stop.set()

    await asyncio.wait_for(wait_for_redis(unreachable, stop), 0.5)


async def test_keeps_retrying_until_stop_is_set(
    unreachable: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="trellis_common.redisconn")

    waiting = asyncio.create_task(wait_for_redis(unreachable, stop, max_delay=0.05))
    await eventually(lambda: caplog.records)  # a first attempt failed: it is waiting
    assert not waiting.done()

    stop.set()
    await asyncio.wait_for(waiting, 0.5)

    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1, "warns once, not on every attempt"
    assert messages[0].startswith("redis.unreachable error=")
    assert "ConnectionError" in messages[0]
    assert messages[0].endswith(" action=retrying")


async def test_returns_once_redis_answers(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    redis_server.kill()
    client = redis.asyncio.Redis.from_url(redis_server.url)
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="trellis_common.redisconn")
    try:
        waiting = asyncio.create_task(wait_for_redis(client, stop, max_delay=0.05))
        await eventually(lambda: caplog.records)  # a first attempt failed: it is waiting
        assert not waiting.done()

        await asyncio.to_thread(redis_server.start)
        await asyncio.wait_for(waiting, 2)

        assert not stop.is_set()
        assert await client.ping()
        assert [r.getMessage().split(" ", 1)[0] for r in caplog.records] == [
            "redis.unreachable",
            "redis.reachable",
        ]
    finally:
        await client.aclose()


async def test_returns_at_once_when_redis_is_up(redis_client: redis.asyncio.Redis) -> None:
    stop = asyncio.Event()

    await asyncio.wait_for(wait_for_redis(redis_client, stop), 1)

    assert not stop.is_set()


# --- the client of connect(): rides over a restart, never hangs on a frozen Redis ---------


async def test_a_command_rides_over_a_restart(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    try:
        await client.set("k", "before")
        redis_server.kill()
        redis_server.start()
        assert await client.get("k") == b"before"
    finally:
        await client.aclose()


async def test_a_frozen_redis_fails_a_command_within_the_socket_timeout(
    redis_server: RedisServer,
) -> None:
    client = connect(redis_server.url, connect_timeout=0.3, socket_timeout=0.3)
    try:
        await client.set("k", "v")
        redis_server.pause()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(RedisTimeoutError):
            await client.get("k")
        # one timeout, not one per retry (six retries would take at least 1.8 s)
        assert loop.time() - started < 1.5
        started = loop.time()
        with pytest.raises(RedisTimeoutError):  # a fresh connection times out as fast
            await client.get("k")
        assert loop.time() - started < 1.5
        redis_server.resume()
        assert await client.get("k") == b"v"
    finally:
        redis_server.resume()
        await client.aclose()
