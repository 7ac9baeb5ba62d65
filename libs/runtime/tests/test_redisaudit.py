"""The Redis audit against a real Redis: each refusal is logged once and counted once."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry
from redis.exceptions import AuthenticationError, NoPermissionError

from trellis_runtime import redisacl, redisconn
from trellis_runtime.redisaudit import RedisAudit
from trellis_testing import RedisServer

USERS = ("admin", *redisacl.COMPONENTS)


@pytest.fixture
async def audit(redis_server: RedisServer) -> AsyncIterator[RedisAudit]:
    client = redisconn.connect(redis_server.target("catalog"))  # rides over restarts
    audit = RedisAudit(client, CollectorRegistry(), USERS, interval=0.1)
    await audit.poll()  # the baseline
    try:
        yield audit
    finally:
        await client.aclose()


def refusals(audit: RedisAudit, error: str) -> float:
    return float(audit.refusals.labels(error)._value.get())


def denied(audit: RedisAudit, user: str, reason: str) -> float:
    return float(audit.denied.labels(user, reason)._value.get())


def lines(caplog: pytest.LogCaptureFixture, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event)]


async def test_a_connection_without_a_password_is_logged_and_counted(
    redis_server: RedisServer, audit: RedisAudit, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trellis_runtime.redisaudit")
    stranger = redis.asyncio.Redis.from_url(redis_server.plain_url, protocol=2)
    with pytest.raises(AuthenticationError):
        await stranger.get("trellis:certmanager:ca")
    await stranger.aclose()

    await audit.poll()
    assert refusals(audit, "NOAUTH") == 1
    assert lines(caplog, "redis.refused") == ["redis.refused error=NOAUTH count=1"]

    await audit.poll()  # nothing new: nothing more
    assert refusals(audit, "NOAUTH") == 1
    assert len(lines(caplog, "redis.refused")) == 1


async def test_a_component_reading_anothers_key_is_logged_with_who_and_what(
    redis_server: RedisServer, audit: RedisAudit, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trellis_runtime.redisaudit")
    proxy_cp = redisconn.connect(redis_server.target("proxy-cp"), retries=0)
    for _ in range(2):
        with pytest.raises(NoPermissionError):
            await proxy_cp.get("trellis:certmanager:ca")
    await audit.poll()
    with pytest.raises(NoPermissionError):
        await proxy_cp.publish("trellis:events:certificates", "{}")
    await proxy_cp.aclose()
    await audit.poll()

    assert denied(audit, "proxy-cp", "key") == 2
    assert denied(audit, "proxy-cp", "channel") == 1
    assert refusals(audit, "NOPERM") == 3
    found = lines(caplog, "redis.acl_denied")
    assert len(found) == 2, found
    assert found[0].startswith(
        "redis.acl_denied user=proxy-cp reason=key object=trellis:certmanager:ca "
        "context=toplevel command=get client=127.0.0.1:"
    )
    assert found[0].endswith(" count=2")
    assert "reason=channel object=trellis:events:certificates" in found[1]


async def test_a_wrong_password_is_counted_under_a_bounded_user_label(
    redis_server: RedisServer, audit: RedisAudit
) -> None:
    for user in ("catalog", "made-up-by-an-attacker"):
        client = redis.asyncio.Redis.from_url(redis_server.plain_url, username=user, password="x")
        with pytest.raises(AuthenticationError):
            await client.ping()
        await client.aclose()
    await audit.poll()
    assert denied(audit, "catalog", "auth") == 1
    assert denied(audit, "other", "auth") == 1
    assert refusals(audit, "WRONGPASS") == 2


async def test_what_came_before_the_first_read_is_the_baseline(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="trellis_runtime.redisaudit")
    stranger = redis.asyncio.Redis.from_url(redis_server.plain_url, protocol=2)
    with pytest.raises(AuthenticationError):
        await stranger.ping()
    await stranger.aclose()
    client = redisconn.connect(redis_server.target("catalog"), retries=0)
    audit = RedisAudit(client, CollectorRegistry(), USERS)
    await audit.poll()
    await client.aclose()
    assert refusals(audit, "NOAUTH") == 0
    assert lines(caplog, "redis.audit_started")[0].startswith(
        "redis.audit_started interval=5.0 noauth_before=1 wrongpass_before=0 noperm_before=0"
    )


async def test_a_restarted_redis_is_counted_from_zero(
    redis_server: RedisServer, audit: RedisAudit
) -> None:
    redis_server.kill()
    redis_server.start()
    stranger = redis.asyncio.Redis.from_url(redis_server.plain_url, protocol=2)
    with pytest.raises(AuthenticationError):
        await stranger.ping()
    await stranger.aclose()
    await audit.poll()  # a new run_id: the one refusal since the restart is new
    assert refusals(audit, "NOAUTH") == 1


async def test_an_audit_its_user_may_not_run_says_so_once_and_stops(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    client = redisconn.connect(redis_server.target("proxy-cp"), retries=0)
    audit = RedisAudit(client, CollectorRegistry(), USERS, interval=0.01)
    try:
        await asyncio.wait_for(audit.run(asyncio.Event()), 5)
    finally:
        await client.aclose()
    assert audit.polls == 0
    assert len(lines(caplog, "redis.audit_refused")) == 1
