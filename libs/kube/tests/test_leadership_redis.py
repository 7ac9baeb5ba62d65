"""Leader election on a Redis lock, against a real Redis with the ACL on.

Each replica logs in as certmanager's own Redis user (the lock's keys are in its ACL), one
of them through a :class:`~trellis_testing.relay.Relay` that the partition test
cuts. The timings are short (a 2 s lock) to keep the tests quick; what they assert is
ordering against the lock's own expiry, never a speed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ResponseError

from trellis_kube import leadership, redislocks
from trellis_kube.leadership import Leadership, Timing
from trellis_runtime import redisacl
from trellis_testing import RedisServer, eventually
from trellis_testing.elections import Contenders, leader_among, leader_and_standby
from trellis_testing.relay import Relay

TIMING = Timing(duration=2.0, renew_deadline=1.4, retry_period=0.2)
KEY = redislocks.lock_key("certmanager")
TOKEN = redislocks.token_key("certmanager")

Elect = Callable[..., Leadership]


def connect(server: RedisServer, user: str, port: int | None = None) -> redis.asyncio.Redis:
    return redis.asyncio.Redis(
        host="127.0.0.1", port=port or server.port, username=user, password=server.password(user)
    )


@pytest.fixture
async def elect(redis_server: RedisServer) -> AsyncIterator[Elect]:
    """A replica of the election ``certmanager`` named ``identity``, as certmanager's user
    (through ``port``, a relay's, if given)."""
    clients: list[redis.asyncio.Redis] = []

    def make(identity: str, port: int | None = None) -> Leadership:
        clients.append(connect(redis_server, "certmanager", port))
        return leadership.elect("certmanager", identity, redis=clients[-1], timing=TIMING)

    yield make
    for client in clients:
        await client.aclose()


async def test_acquires_renews_and_a_standby_observes(
    elect: Elect, redis_admin: redis.asyncio.Redis
) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with leader_and_standby(a, b):
        assert await redis_admin.get(KEY) == b"certmanager-1"
        assert 0 < await redis_admin.pttl(KEY) <= 2000
        assert a.token == 1
        assert b.token == 1
        assert not b.leading
        # renewals keep the lock past its first expiry, in the same term
        await asyncio.sleep(TIMING.duration * 1.5)
        assert await redis_admin.get(KEY) == b"certmanager-1"
        assert a.leading
        assert await redis_admin.get(TOKEN) == b"1"


async def test_a_killed_leader_is_replaced_once_its_lock_expires(
    elect: Elect, redis_admin: redis.asyncio.Redis
) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with leader_and_standby(a, b) as (_, a_task):
        async with Contenders((a, b)) as watch:
            a_task.cancel()  # killed: no release
            await asyncio.sleep(0)
            assert await redis_admin.get(KEY) == b"certmanager-1"  # still held, unrenewed
            assert await b.wait_leading(asyncio.Event())
        assert await redis_admin.get(KEY) == b"certmanager-2"
        assert b.token == 2
        assert watch.samples
        assert not watch.overlaps


async def test_a_clean_stop_releases_the_lock(
    elect: Elect, redis_admin: redis.asyncio.Redis
) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with leader_and_standby(a, b) as (a_stop, a_task):
        async with Contenders((a, b)) as watch:
            a_stop.set()
            await a_task
            # released, not left to expire: gone while it still had time to live
            assert await redis_admin.get(KEY) in (None, b"certmanager-2")
            assert await b.wait_leading(asyncio.Event())
        assert b.token == 2
        assert watch.samples
        assert not watch.overlaps


async def test_concurrent_acquisitions_one_wins(redis_server: RedisServer) -> None:
    clients = [connect(redis_server, "certmanager") for _ in range(4)]
    try:
        locks = [
            redislocks.RedisLock(client, "certmanager", f"r{n}", 2.0)
            for n, client in enumerate(clients)
        ]
        for round_ in range(1, 6):
            seen = await asyncio.gather(*(lock.attempt(False, 0.0) for lock in locks))
            assert sum(s.acquired for s in seen) == 1
            (winner,) = [lock for lock, s in zip(locks, seen, strict=True) if s.acquired]
            assert {s.token for s in seen if s.acquired} == {round_}
            await winner.release()
    finally:
        for client in clients:
            await client.aclose()


async def test_fencing_tokens_strictly_increase_across_handovers(elect: Elect) -> None:
    replicas = [elect(f"certmanager-{n}") for n in range(3)]
    stops = [asyncio.Event() for _ in replicas]
    tasks = [asyncio.create_task(r.run(s)) for r, s in zip(replicas, stops, strict=True)]
    try:
        async with Contenders(tuple(replicas)) as watch:
            for handover in range(4):
                leader = await leader_among(replicas)
                n = replicas.index(leader)
                if handover % 2:
                    tasks[n].cancel()  # killed
                else:
                    stops[n].set()  # clean
                with contextlib.suppress(asyncio.CancelledError):
                    await tasks[n]
                # the replica comes back (a restart), with a fresh loop
                stops[n] = asyncio.Event()
                tasks[n] = asyncio.create_task(leader.run(stops[n]))
            await eventually(lambda: any(r.leading for r in replicas), timeout=10)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    tokens = watch.elected_tokens()
    assert len(tokens) >= 5
    assert tokens == sorted(set(tokens))  # strictly increasing
    assert not watch.overlaps, watch.overlaps


async def test_a_partitioned_leader_steps_down_before_its_lock_expires(
    redis_server: RedisServer, elect: Elect, redis_admin: redis.asyncio.Redis
) -> None:
    async with Relay("127.0.0.1", redis_server.port) as relay:
        a, b = elect("certmanager-1", relay.port), elect("certmanager-2")
        async with leader_and_standby(a, b):
            async with Contenders((a, b)) as watch:
                relay.cut()
                # the lock's own expiry: Redis' clock now, plus what is left of its TTL
                pipe = redis_admin.pipeline(transaction=True)
                pipe.time()
                pipe.pttl(KEY)
                (seconds, micros), left_ms = await pipe.execute()
                expires = seconds + micros / 1e6 + left_ms / 1000
                assert await b.wait_leading(asyncio.Event())
                assert not a.leading  # still cut off: it knows it does not lead
                relay.heal()
                await eventually(lambda: a.holder == "certmanager-2")
            assert watch.last_leading["certmanager-1"] < expires
            assert watch.stepped_down("certmanager-1") < expires
            assert not watch.overlaps
            assert b.token == 2


async def test_the_acl_keeps_each_component_to_its_own_elections(
    redis_server: RedisServer,
) -> None:
    catalog = connect(redis_server, "catalog")
    try:
        with pytest.raises(ResponseError, match="no permissions"):
            await redislocks.RedisLock(catalog, "certmanager", "intruder", 2.0).attempt(False, 0)
    finally:
        await catalog.aclose()
    async with redis.asyncio.Redis.from_url(redis_server.url) as admin:
        assert await admin.get(KEY) is None
    for name in ("certmanager", "endpoints-vm"):  # the elected components
        own = connect(redis_server, name)
        try:
            lock = redislocks.RedisLock(own, name, f"{name}-1", 2.0)
            assert (await lock.attempt(False, 0)).acquired
            await lock.release()
        finally:
            await own.aclose()
    rules: dict[str, Any] = {n: c.rules() for n, c in redisacl.COMPONENTS.items()}
    assert "~trellis:leader:certmanager" in rules["certmanager"]
    assert not any("leader" in rule for rule in rules["catalog"])
    assert not any("leader" in rule for rule in rules["endpoints-k8s"])  # it elects no one
