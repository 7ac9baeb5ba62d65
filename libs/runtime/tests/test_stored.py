"""Records in a Redis hash: each loaded on its own, refused ones reported until overwritten."""

from __future__ import annotations

import json

import redis.asyncio

from trellis_runtime.health import Health
from trellis_runtime.stored import Refused, Rejected, load_hash


def parse(field: str, raw: bytes | str) -> dict[str, int]:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"record {field} is not an object")
    return value


async def test_a_bad_record_is_rejected_and_the_others_load(
    redis_client: redis.asyncio.Redis,
) -> None:
    await redis_client.hset("h", mapping={"a": '{"n": 1}', "b": "[1]", "c": '{"n": 3}'})
    loaded = await load_hash(redis_client, "h", parse, "test records")
    assert sorted(r["n"] for r in loaded.records) == [1, 3]
    assert loaded.rejected == [Rejected("b", "h[b]", "record b is not an object")]


async def test_a_key_that_is_not_a_hash_is_one_rejection(
    redis_client: redis.asyncio.Redis,
) -> None:
    await redis_client.set("h", "a string")
    loaded = await load_hash(redis_client, "h", parse, "test records")
    assert loaded.records == []
    [rejected] = loaded.rejected
    assert (rejected.field, rejected.key) == ("", "h")
    assert rejected.reason.startswith("not a hash of test records: WRONGTYPE")


def test_a_refused_record_is_reported_until_it_is_overwritten() -> None:
    health = Health()
    refused = Refused(health.rejections, "redis")
    refused.add(Rejected("b", "h[b]", "broken"))
    assert "b" in refused
    assert (refused.fields(), len(refused)) == (["b"], 1)
    assert [(r.source, r.key, r.reason) for r in health.rejections.items()] == [
        ("redis", "h[b]", "broken")
    ]
    refused.overwritten("a")  # never refused: nothing changes
    refused.overwritten("b")
    assert "b" not in refused
    assert health.rejections.items() == []


async def test_handing_a_record_on_never_raises_and_reports_each_failure() -> None:
    health = Health()
    handed: list[str] = []

    async def hand_on(key: str) -> None:
        if key == "bad":
            raise RuntimeError("the consumer choked")
        handed.append(key)

    assert await health.rejections.guarded("views", "bad", hand_on("bad")) is False
    assert await health.rejections.guarded("views", "good", hand_on("good")) is True
    assert handed == ["good"]
    [rejection] = health.rejections.items()
    assert (rejection.source, rejection.key) == ("views", "bad")
    assert rejection.reason == "RuntimeError: the consumer choked"
    assert await health.rejections.guarded("views", "bad", hand_on("fixed")) is True
    assert health.rejections.items() == []  # the same key went through: accepted again
