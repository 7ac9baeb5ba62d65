"""Scriptless atomic writes on a real Redis: revisions from racing publishers, and swaps."""

from __future__ import annotations

import asyncio

import redis.asyncio

from trellis_runtime import redisatomic
from trellis_runtime.signaling import Publisher, revision_key
from trellis_testing import RedisServer


async def test_racing_publishers_get_distinct_revisions_each_published(
    redis_server: RedisServer,
) -> None:
    client = redis.asyncio.from_url(redis_server.url)
    listener = client.pubsub()
    await listener.subscribe("trellis:events:topic")
    await listener.get_message(timeout=1)  # the subscribe confirmation
    publishers = [Publisher(client, sender=f"p{i}") for i in range(5)]
    events = await asyncio.gather(
        *(p.publish("topic", "changed", str(n)) for n in range(10) for p in publishers)
    )
    # each transaction lost to the others was read again: no revision twice, none skipped
    assert sorted(e.revision for e in events) == list(range(1, 51))
    assert await client.get(revision_key("topic")) == b"50"
    heard = []
    while (message := await listener.get_message(timeout=1)) is not None:
        heard.append(message["data"])
    assert len(heard) == 50  # every revision rang its bell, once
    await listener.aclose()  # type: ignore[no-untyped-call]
    await client.aclose()


async def test_a_swap_writes_only_over_what_it_expected(redis_server: RedisServer) -> None:
    client = redis.asyncio.from_url(redis_server.url)
    await client.set("k", "old")
    assert not await redisatomic.swap(client, "k", "other", "new")
    assert await client.get("k") == b"old"
    assert await redisatomic.swap(client, "k", b"old", "new")
    assert await client.get("k") == b"new"
    await client.hset("h", "f", "a")
    assert not await redisatomic.swap(client, "h", "b", "c", field="f")
    assert await redisatomic.swap(client, "h", "a", "c", field="f")
    assert await client.hget("h", "f") == b"c"
    await client.aclose()
