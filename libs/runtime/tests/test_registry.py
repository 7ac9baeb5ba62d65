"""The service registry against a real redis-server: announce, discover, expire, restore."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from trellis_common.backoff import Backoff
from trellis_runtime.redisconn import connect
from trellis_runtime.registry import (
    REGISTRY_TOPIC,
    Announcer,
    ServiceRecord,
    discover,
    registry_key,
)
from trellis_runtime.signaling import Publisher
from trellis_runtime.subscriber import Subscriber
from trellis_testing import RedisServer, eventually
from trellis_testing.signaling import RecordingReceiver, running

FAST = Backoff(initial=0.01, maximum=0.2)
KIND = "endpoints-provider"


def record(name: str = "vm-1", **attributes: str) -> ServiceRecord:
    return ServiceRecord.create(
        KIND, name, "10.0.0.1:15040", "10.0.0.1:15041", attributes=attributes
    )


@contextlib.asynccontextmanager
async def announcing(announcer: Announcer) -> AsyncIterator[asyncio.Event]:
    stop = asyncio.Event()
    task = asyncio.create_task(announcer.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 5.0)


def registry_events(receiver: RecordingReceiver) -> list[tuple[str, str]]:
    return [(e.kind, e.key) for e in receiver.events]


# --- ServiceRecord ---------------------------------------------------------------------


def test_record_json_round_trip_and_attributes() -> None:
    original = ServiceRecord.create(
        "certmanager", "cm-0", "127.0.0.1:15020", "127.0.0.1:15021",
        attributes={"zone": "b", "version": "1.2"}, started_at=1700000000.5,
    )  # fmt: skip
    assert original.attributes == (("version", "1.2"), ("zone", "b"))
    assert original.attribute("zone") == "b"
    assert original.attribute("missing") is None
    assert original.service_id == "certmanager/cm-0"
    assert ServiceRecord.from_json(original.to_json()) == original
    assert hash(original) == hash(ServiceRecord.from_json(original.to_json()))


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        ("{", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"kind":"k","name":"n","grpc_address":"a","admin_address":"b"}', "started_at"),
        ('{"kind":"k","name":"n","grpc_address":1,"admin_address":"b","started_at":1}', "grpc"),
        (
            '{"kind":"k","name":"n","grpc_address":"a","admin_address":"b","started_at":1,'
            '"attributes":{"x":1}}',
            "attributes",
        ),
        ('{"kind":"a:b","name":"n","grpc_address":"a","admin_address":"b","started_at":1}', "kind"),
    ],
)
def test_record_from_json_rejects_malformed(payload: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        ServiceRecord.from_json(payload)


@pytest.mark.parametrize("name", ["", "a:b", "a*", "-x", "a b"])
def test_record_rejects_names_that_break_keys(name: str) -> None:
    with pytest.raises(ValueError, match="name"):
        record(name)


# --- Announcer and discover ------------------------------------------------------------


async def test_announce_then_discover(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = Subscriber(
        redis_server.url, [REGISTRY_TOPIC], receiver.on_event, receiver.on_resync, backoff=FAST
    )
    first, second = record("vm-1", zone="a"), record("vm-2")
    async with running(subscriber):
        async with (
            announcing(Announcer(redis_client, first, ttl=2.0)),
            announcing(Announcer(redis_client, second, ttl=2.0)),
        ):
            await eventually(lambda: len(receiver.events) == 2)
            assert await discover(redis_client, KIND) == [first, second]
            assert await discover(redis_client, "catalog") == []
            ttl_ms = await redis_client.pttl(registry_key(KIND, "vm-1"))
            assert 0 < ttl_ms <= 2000
        await eventually(lambda: len(receiver.events) == 4)
    assert sorted(registry_events(receiver)) == [
        ("down", f"{KIND}/vm-1"),
        ("down", f"{KIND}/vm-2"),
        ("up", f"{KIND}/vm-1"),
        ("up", f"{KIND}/vm-2"),
    ]
    assert {e.sender for e in receiver.events} == {f"{KIND}/vm-1", f"{KIND}/vm-2"}


async def test_stop_deletes_the_key_and_says_down(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = Subscriber(
        redis_server.url, [REGISTRY_TOPIC], receiver.on_event, receiver.on_resync, backoff=FAST
    )
    announcer = Announcer(redis_client, record(), ttl=10.0)
    async with running(subscriber):
        async with announcing(announcer):
            await eventually(lambda: announcer.announced)
            assert await redis_client.exists(announcer.key) == 1
        assert await redis_client.exists(announcer.key) == 0
        assert await discover(redis_client, KIND) == []
        await eventually(lambda: registry_events(receiver)[-1:] == [("down", f"{KIND}/vm-1")])
    assert registry_events(receiver) == [("up", f"{KIND}/vm-1"), ("down", f"{KIND}/vm-1")]


async def test_record_expires_when_heartbeats_stop(redis_client: redis.asyncio.Redis) -> None:
    # One heartbeat, then none for a minute: the 1 s TTL is all that keeps the key.
    announcer = Announcer(redis_client, record(), ttl=1.0, interval=60.0)
    async with announcing(announcer):
        await eventually(lambda: announcer.announced)
        assert [r.name for r in await discover(redis_client, KIND)] == ["vm-1"]

        async def gone() -> bool:
            return await discover(redis_client, KIND) == []

        await eventually(gone, timeout=3.0)


async def test_heartbeats_keep_a_short_ttl_record_alive(redis_client: redis.asyncio.Redis) -> None:
    announcer = Announcer(redis_client, record(), ttl=0.3)  # heartbeat every 0.1 s
    async with announcing(announcer):
        await eventually(lambda: announcer.announced)
        first = await redis_client.pttl(announcer.key)
        # seven heartbeats take more than two TTLs: only heartbeats can keep it there
        await eventually(lambda: announcer.heartbeats >= 7)
        assert 0 < first <= 300
        assert [r.name for r in await discover(redis_client, KIND)] == ["vm-1"]


async def test_record_comes_back_after_redis_loses_it(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = Subscriber(
        redis_server.url, [REGISTRY_TOPIC], receiver.on_event, receiver.on_resync, backoff=FAST
    )
    announcer = Announcer(redis_client, record(), ttl=0.6, backoff=FAST)
    async with running(subscriber), announcing(announcer):
        await eventually(lambda: registry_events(receiver) == [("up", f"{KIND}/vm-1")])

        redis_server.kill()
        redis_server.wipe()
        redis_server.start()

        async def back() -> bool:
            return [r.name for r in await discover(redis_client, KIND)] == ["vm-1"]

        await eventually(back)
        # The heartbeat found the key gone and rang "up" again on the wiped counter; the
        # subscriber got it as an event or through its reconnect resync.
        await eventually(
            lambda: subscriber.connected and subscriber.last_revision(REGISTRY_TOPIC) >= 1
        )
        assert await Publisher(redis_client, "test").current_revision(REGISTRY_TOPIC) >= 1
        assert subscriber.resyncs >= 2


async def test_announcer_waits_for_redis_and_never_raises(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    redis_server.kill()
    client = redis.asyncio.Redis.from_url(redis_server.url)  # no retries: every error shows
    try:
        announcer = Announcer(client, record(), ttl=0.6, backoff=FAST)
        with caplog.at_level(logging.WARNING, logger="trellis_runtime.registry"):
            async with announcing(announcer):
                await eventually(  # the first heartbeat met the dead Redis
                    lambda: any("registry.heartbeat_failed" in r.msg for r in caplog.records)
                )
                assert not announcer.announced
                redis_server.start()
                await eventually(lambda: announcer.announced)
                assert [r.name for r in await discover(client, KIND)] == ["vm-1"]
    finally:
        await client.aclose()
    failures = [r for r in caplog.records if "registry.heartbeat_failed" in r.msg]
    assert len(failures) == 1  # logged once, retried quietly


async def test_a_frozen_redis_neither_hangs_the_announcer_nor_its_stop(
    redis_server: RedisServer,
) -> None:
    client = connect(redis_server.url, connect_timeout=0.3, socket_timeout=0.3)
    try:
        announcer = Announcer(client, record(), ttl=0.6, backoff=FAST)
        stop = asyncio.Event()
        task = asyncio.create_task(announcer.run(stop))
        await eventually(lambda: announcer.announced)
        redis_server.pause()
        try:
            await eventually(lambda: not announcer.announced, timeout=3)
            loop = asyncio.get_running_loop()
            started = loop.time()
            stop.set()  # the withdrawal cannot reach Redis: bounded, not a hang
            await asyncio.wait_for(task, 5)
            assert loop.time() - started < 3
        finally:
            redis_server.resume()
    finally:
        await client.aclose()


async def test_discover_skips_malformed_records(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    good = record("vm-1")
    await redis_client.set(registry_key(KIND, "vm-1"), good.to_json())
    await redis_client.set(registry_key(KIND, "broken"), "{not json")
    await redis_client.set(registry_key(KIND, "imposter"), record("vm-9").to_json())
    with caplog.at_level(logging.WARNING, logger="trellis_runtime.registry"):
        assert await discover(redis_client, KIND) == [good]
    malformed = [r.getMessage() for r in caplog.records if "registry.malformed" in r.msg]
    assert len(malformed) == 2
    assert any(f"key=trellis:registry:{KIND}:broken" in line for line in malformed)
