"""Signaling against a real redis-server: ordering, gaps, resets, restarts, failures."""

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redis.asyncio

from trellis_common.backoff import Backoff
from trellis_runtime.signaling import Event, Publisher, channel_name, revision_key
from trellis_runtime.subscriber import Subscriber
from trellis_testing import RedisServer, eventually
from trellis_testing.signaling import RecordingReceiver, running

TOPIC = "certs"
FAST = Backoff(initial=0.01, maximum=0.2)


def make_subscriber(
    source: str | Callable[[], redis.asyncio.Redis],
    receiver: RecordingReceiver,
    topics: tuple[str, ...] = (TOPIC,),
    **kwargs: Any,
) -> Subscriber:
    return Subscriber(source, topics, receiver.on_event, receiver.on_resync, backoff=FAST, **kwargs)


# --- Event -----------------------------------------------------------------------------


def test_event_json_round_trip() -> None:
    event = Event(topic="certs", kind="issued", key="ns/bookstore", revision=7, sender="cm-1")
    payload = event.to_json()
    assert " " not in payload
    assert Event.from_json(payload) == event
    assert Event.from_json(payload.encode()) == event


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        ("not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"topic":"t","kind":"k","key":"x","sender":"s"}', "'revision'"),
        ('{"topic":"t","kind":"k","key":"x","revision":"1","sender":"s"}', "'revision'"),
        ('{"topic":"t","kind":"k","key":"x","revision":true,"sender":"s"}', "'revision'"),
        ('{"topic":"t","kind":"k","key":"x","revision":-1,"sender":"s"}', "'revision'"),
        ('{"topic":"t","kind":1,"key":"x","revision":1,"sender":"s"}', "'kind'"),
    ],
)
def test_event_from_json_rejects_malformed(payload: str | bytes, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        Event.from_json(payload)


# --- Publisher -------------------------------------------------------------------------


async def test_publisher_counts_revisions_per_topic(redis_client: redis.asyncio.Redis) -> None:
    publisher = Publisher(redis_client, sender="cm-1")
    assert await publisher.current_revision(TOPIC) == 0
    first = await publisher.publish(TOPIC, "issued", "ns/a")
    second = await publisher.publish(TOPIC, "rotated", "ns/a")
    other = await publisher.publish("endpoints", "changed", "ns/b")
    assert (first.revision, second.revision, other.revision) == (1, 2, 1)
    assert second == Event(TOPIC, "rotated", "ns/a", 2, "cm-1")
    assert await publisher.current_revision(TOPIC) == 2
    assert await redis_client.get(revision_key(TOPIC)) == b"2"


async def test_a_publisher_never_goes_back_after_redis_lost_its_counter(
    redis_client: redis.asyncio.Redis,
) -> None:
    """The lost-update guard: a consumer that skips events at or below a listing's revision
    would skip every event after a FLUSHALL if the counter started over."""
    publisher = Publisher(redis_client, sender="vm-1")
    for key in ("a", "b", "c"):
        await publisher.publish(TOPIC, "changed", key)
    await redis_client.flushall()
    assert await publisher.current_revision(TOPIC) == 3
    after = await publisher.publish(TOPIC, "changed", "d")
    assert after.revision == 4
    assert await redis_client.get(revision_key(TOPIC)) == b"4"


# --- Subscriber: the normal path -------------------------------------------------------


async def test_events_arrive_in_order_with_consecutive_revisions(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        assert receiver.resyncs == [TOPIC]  # the first subscribe resyncs too
        assert subscriber.connected
        sent = [await publisher.publish(TOPIC, "issued", f"ns/svc-{i}") for i in range(20)]
        await eventually(lambda: len(receiver.events) == 20)
    assert receiver.events == sent
    assert receiver.revisions() == list(range(1, 21))
    assert subscriber.resyncs == 1
    assert not subscriber.connected


async def test_subscriber_starts_from_the_current_revision(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    publisher = Publisher(redis_client, sender="cm-1")
    for _ in range(5):
        await publisher.publish(TOPIC, "issued", "ns/old")
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    async with running(subscriber):
        assert subscriber.last_revision(TOPIC) == 5
        await publisher.publish(TOPIC, "issued", "ns/new")
        await eventually(lambda: receiver.revisions() == [6])
    assert subscriber.resyncs == 1


async def test_two_publishers_keep_revisions_strictly_increasing(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    other_client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        publishers = [Publisher(redis_client, "cm-1"), Publisher(other_client, "cm-2")]
        receiver = RecordingReceiver()
        async with running(make_subscriber(redis_server.url, receiver)):

            async def burst(publisher: Publisher) -> list[Event]:
                return [await publisher.publish(TOPIC, "issued", f"k{i}") for i in range(40)]

            results = await asyncio.gather(*(burst(p) for p in publishers))
            await eventually(lambda: len(receiver.events) == 80)
    finally:
        await other_client.aclose()
    assert receiver.revisions() == list(range(1, 81))
    assert {e.sender for e in receiver.events} == {"cm-1", "cm-2"}
    assert sorted(e.revision for r in results for e in r) == list(range(1, 81))
    assert receiver.resyncs == [TOPIC]


async def test_topics_are_independent(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver, topics=("a", "b"))
    publisher = Publisher(redis_client, sender="s")
    async with running(subscriber):
        assert sorted(receiver.resyncs) == ["a", "b"]
        for topic in ("a", "b", "a", "ignored", "b", "a"):
            await publisher.publish(topic, "changed", "k")
        await eventually(lambda: len(receiver.events) == 5)
    assert receiver.revisions("a") == [1, 2, 3]
    assert receiver.revisions("b") == [1, 2]
    assert subscriber.resyncs == 2


# --- Subscriber: things that go wrong in the stream ------------------------------------


async def test_malformed_messages_are_logged_and_skipped(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = RecordingReceiver()
    publisher = Publisher(redis_client, sender="cm-1")
    channel = channel_name(TOPIC)
    async with running(make_subscriber(redis_server.url, receiver)):
        with caplog.at_level(logging.WARNING, logger="trellis_runtime.subscriber"):
            await redis_client.publish(channel, "not json at all")
            await redis_client.publish(channel, b"\xff\x00")
            await redis_client.publish(channel, '{"topic":"certs","kind":"issued"}')
            wrong_topic = Event("other", "issued", "k", 1, "x").to_json()
            await redis_client.publish(channel, wrong_topic)
            await publisher.publish(TOPIC, "issued", "ns/a")
            await eventually(lambda: receiver.revisions() == [1])
    malformed = [r.getMessage() for r in caplog.records if "signaling.malformed" in r.msg]
    assert len(malformed) == 4
    assert all("topic=certs" in line for line in malformed)
    assert receiver.resyncs == [TOPIC]


async def test_revision_gap_triggers_resync(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        await publisher.publish(TOPIC, "issued", "ns/a")
        await eventually(lambda: receiver.revisions() == [1])
        await redis_client.incr(revision_key(TOPIC))  # revision 2 is never rung
        await publisher.publish(TOPIC, "issued", "ns/b")  # revision 3
        await eventually(lambda: receiver.resyncs == [TOPIC, TOPIC])
        assert subscriber.last_revision(TOPIC) == 3
        await publisher.publish(TOPIC, "issued", "ns/c")
        await eventually(lambda: receiver.revisions() == [1, 4])  # 3 is covered by the resync


async def test_counter_reset_in_stream_triggers_resync(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        for key in ("a", "b", "c"):
            await publisher.publish(TOPIC, "issued", key)
        await eventually(lambda: receiver.revisions() == [1, 2, 3])
        await redis_client.delete(revision_key(TOPIC))  # e.g. a FLUSHALL
        restarted = Publisher(redis_client, sender="cm-1")  # an owner that restarted too
        await restarted.publish(TOPIC, "issued", "d")  # revision 1 again
        await eventually(lambda: len(receiver.resyncs) == 2)
        assert subscriber.last_revision(TOPIC) == 1
        await restarted.publish(TOPIC, "issued", "e")
        await eventually(lambda: receiver.revisions() == [1, 2, 3, 2])


async def test_failing_callbacks_do_not_kill_the_subscriber(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = RecordingReceiver()
    receiver.fail_resyncs = 1  # the very first resync fails: it is retried
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    with caplog.at_level(logging.INFO, logger="trellis_runtime.subscriber"):
        async with running(subscriber):
            await eventually(lambda: len(receiver.resyncs) == 2)
            receiver.fail_events = 1
            await publisher.publish(TOPIC, "issued", "ns/a")  # its handler fails: resync
            await eventually(lambda: len(receiver.resyncs) == 3)
            await publisher.publish(TOPIC, "issued", "ns/b")
            await eventually(lambda: receiver.revisions() == [1, 2])
            assert subscriber.connected
    failures = [r.getMessage() for r in caplog.records if "callback_failed" in r.msg]
    assert any("callback=on_resync topic=certs" in f for f in failures)
    assert any("callback=on_event topic=certs" in f for f in failures)


# --- Subscriber: Redis goes away -------------------------------------------------------


async def test_subscriber_recovers_from_redis_kill_and_restart(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        await publisher.publish(TOPIC, "issued", "ns/a")
        await eventually(lambda: receiver.revisions() == [1])

        redis_server.kill()
        await eventually(lambda: not subscriber.connected)
        redis_server.start()
        await eventually(lambda: subscriber.connected and subscriber.resyncs == 2)

        assert receiver.resyncs == [TOPIC, TOPIC]
        assert subscriber.last_revision(TOPIC) == 1  # the counter survived (AOF)
        await publisher.publish(TOPIC, "rotated", "ns/a")
        await eventually(lambda: receiver.revisions() == [1, 2])


async def test_events_published_while_reconnecting_are_not_lost(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        redis_server.kill()
        redis_server.start()
        for i in range(10):  # races with the subscriber's reconnect
            await publisher.publish(TOPIC, "issued", f"k{i}")
        # Each of the 10 either arrived as an event or is covered by the reconnect resync.
        await eventually(lambda: subscriber.resyncs >= 2 and subscriber.last_revision(TOPIC) == 10)
        await publisher.publish(TOPIC, "issued", "after")
        await eventually(lambda: receiver.revisions()[-1:] == [11])


async def test_wiped_restart_counter_going_backwards_resyncs(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(redis_server.url, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        for key in ("a", "b", "c"):
            await publisher.publish(TOPIC, "issued", key)
        await eventually(lambda: subscriber.last_revision(TOPIC) == 3)

        redis_server.kill()
        redis_server.wipe()
        redis_server.start()
        await eventually(lambda: subscriber.connected and subscriber.resyncs == 2)
        assert subscriber.last_revision(TOPIC) == 0

        # The live publisher keeps its floor: 4, which the subscriber (at 0 after the
        # wipe) sees as a gap, so it resyncs rather than trusting the event alone.
        assert (await publisher.publish(TOPIC, "issued", "d")).revision == 4
        await eventually(lambda: subscriber.resyncs == 3 and subscriber.last_revision(TOPIC) == 4)
        assert receiver.revisions() == [1, 2, 3]


async def test_subscriber_notices_a_frozen_redis(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    receiver = RecordingReceiver()
    subscriber = make_subscriber(
        redis_server.url, receiver, health_check_interval=0.1, socket_timeout=0.3
    )
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        redis_server.pause()  # TCP stays up, nothing answers: only the PING notices
        try:
            await eventually(lambda: not subscriber.connected, timeout=3.0)
        finally:
            redis_server.resume()
        await eventually(lambda: subscriber.connected and subscriber.resyncs == 2)
        await publisher.publish(TOPIC, "issued", "ns/a")
        await eventually(lambda: receiver.revisions() == [1])


async def test_client_that_reconnects_by_itself_still_resyncs(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    # A factory client with redis-py's default retries would reconnect and resubscribe
    # silently; the subscriber must notice and resync anyway.
    receiver = RecordingReceiver()

    def factory() -> redis.asyncio.Redis:
        return redis.asyncio.Redis(  # retries 10x
            host="127.0.0.1",
            port=redis_server.port,
            username="admin",
            password=redis_server.password("admin"),
        )

    subscriber = make_subscriber(factory, receiver)
    publisher = Publisher(redis_client, sender="cm-1")
    async with running(subscriber):
        redis_server.kill()
        redis_server.start()
        await eventually(lambda: subscriber.connected and subscriber.resyncs == 2)
        await publisher.publish(TOPIC, "issued", "ns/a")
        await eventually(lambda: receiver.revisions() == [1])


async def test_subscriber_waits_for_redis_that_is_not_up_yet(redis_server: RedisServer) -> None:
    redis_server.kill()
    receiver = RecordingReceiver()
    states: list[tuple[bool, str]] = []
    subscriber = make_subscriber(
        redis_server.url, receiver, on_state=lambda up, why: states.append((up, why))
    )
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    await eventually(lambda: len(states) >= 2)  # it tried, failed, and tried again
    assert not any(up for up, _ in states)
    assert "ConnectionError" in states[0][1]
    assert not subscriber.ready.is_set()
    redis_server.start()
    await eventually(subscriber.ready.is_set)
    assert receiver.resyncs == [TOPIC]
    stop.set()
    await asyncio.wait_for(task, 1.0)
