"""Waiting for Redis at start-up: retry quietly until it answers or the service stops."""

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio
from redis.exceptions import TimeoutError as RedisTimeoutError

from trellis_runtime import redisconn
from trellis_runtime.redisconn import RedisRefused, RedisTarget, connect, wait_for_redis
from trellis_testing import RedisServer, eventually
from trellis_testing.ports import free_port


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
    caplog.set_level(logging.INFO, logger="trellis_runtime.redisconn")

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
    caplog.set_level(logging.INFO, logger="trellis_runtime.redisconn")
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


# --- credentials ----------------------------------------------------------------------------


def test_a_target_takes_its_password_from_the_file_and_never_shows_it(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-value\n")
    secret.chmod(0o600)
    url = "redis://10.0.0.5:6380/2"

    assert RedisTarget.create(url, "", secret, "catalog").username == "catalog"
    assert RedisTarget.create("redis://ops@h:1/0", "", secret, "catalog").username == "ops"
    target = RedisTarget.create(url, "proxy-cp", secret, "catalog")
    assert (target.username, target.password) == ("proxy-cp", "s3cret-value")
    assert target.describe() == "10.0.0.5:6380/2 user=proxy-cp"
    assert "s3cret" not in repr(target)
    assert RedisTarget.create("redis://u:p@h:1/0").describe() == "h:1/0 user=u"
    assert RedisTarget.create(url).password is None  # the URL's credentials, if any


@pytest.mark.parametrize(("content", "problem"), [(None, "cannot be read"), ("  \n", "is empty")])
def test_a_password_file_that_cannot_serve_is_named(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "pw"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=f"redis_password_file '{path}' {problem}"):
        RedisTarget.create("redis://h:1/0", "", path, "catalog")


def test_a_password_file_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "pw"
    path.write_text("x")
    path.chmod(0o644)
    RedisTarget.create("redis://h:1/0", "", path, "catalog")
    assert [r.getMessage() for r in caplog.records] == [
        f"redis.password_file_open path={path} mode=644 advice=chmod 600"
    ]


async def test_a_refused_login_stops_the_wait_with_the_user_and_no_password(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = tmp_path / "pw"
    wrong.write_text("not-the-password")
    client = connect(RedisTarget.create(redis_server.plain_url, "catalog", wrong), retries=0)
    try:
        with pytest.raises(RedisRefused, match="refused user 'catalog'"):
            await asyncio.wait_for(wait_for_redis(client, asyncio.Event()), 5)
    finally:
        await client.aclose()
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "redis.refused user=catalog" in logged
    assert "not-the-password" not in logged


async def test_a_component_logs_in_as_its_own_user(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    client = connect(redis_server.target("endpoints-vm"))
    try:
        await wait_for_redis(client, asyncio.Event())
        users = [c["user"] for c in await redis_client.client_list()]
        assert sorted(users) == ["admin", "endpoints-vm"]  # the test's, and the component's
    finally:
        await client.aclose()


def test_the_retry_budgets_cover_what_the_docstring_says() -> None:
    """A plain client rides over a restart (a few seconds), a Sentinel client over a
    failover (about FAILOVER_SECONDS): the backoff's sum, without jitter, is what they wait."""

    def waited(retries: int) -> float:
        return float(sum(min(1.0, 0.05 * 2.0**n) for n in range(1, retries + 1)))

    assert redisconn.BACKOFF.compute(1) == pytest.approx(0.1)
    assert 3.0 <= waited(redisconn.RETRIES) <= 4.0
    assert waited(redisconn.FAILOVER_RETRIES) == pytest.approx(redisconn.FAILOVER_SECONDS, abs=0.5)
