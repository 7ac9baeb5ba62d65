"""The one event path against a real redis-server: owners signal, followers fetch and resync."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import redis.asyncio

from trellis_runtime.events import RESYNC, Follower, Outbox, Signals
from trellis_runtime.health import Health
from trellis_runtime.signaling import Event, Publisher
from trellis_testing import RedisServer, eventually


class Owner:
    """The state an owner serves (what a gRPC Get/List would answer)."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.down = False  # its API does not answer

    def get(self, key: str) -> str | None:
        if self.down:
            raise ConnectionError("owner unreachable")
        return self.items.get(key)

    def list(self) -> dict[str, str]:
        if self.down:
            raise ConnectionError("owner unreachable")
        return dict(self.items)


class Mirror(Follower):
    """A consumer keeping a copy of an owner's items: fetch on a signal, list on a resync."""

    def __init__(self, owner: Owner, topics: tuple[str, ...] = ("items",)) -> None:
        super().__init__("mirror")
        self.topics = topics
        self.owner = owner
        self.items: dict[str, str] = {}
        self.resyncs: list[str] = []
        self.fetched: list[str] = []
        self.lost_count = 0

    async def resync(self, topic: str) -> None:
        self.resyncs.append(topic)
        self.items = self.owner.list()

    async def changed(self, event: Event) -> None:
        value = self.owner.get(event.key)
        self.fetched.append(event.key)
        if value is None:
            self.items.pop(event.key, None)
        else:
            self.items[event.key] = value

    def lost(self) -> None:
        self.lost_count += 1


@contextlib.asynccontextmanager
async def running(hub: Signals) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(hub.run(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)


def loop_state(health: Health, name: str) -> tuple[bool, str]:
    status = next(s for s in health.loops.statuses() if s.name == name)
    return status.up, status.reason


async def test_a_follower_resyncs_first_then_fetches_what_each_signal_names(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    owner, health = Owner(), Health()
    owner.items = {"ns/a": "1"}
    hub = Signals(redis_server.url, health)
    mirror = hub.follow(Mirror(owner))
    assert isinstance(mirror, Mirror)
    publisher = Publisher(redis_client, sender="owner-1")
    assert loop_state(health, "mirror")[0] is False  # down until its first resync
    async with running(hub):
        await asyncio.wait_for(mirror.synced.wait(), 5)
        assert mirror.items == {"ns/a": "1"}
        assert loop_state(health, "mirror") == (True, "")
        assert loop_state(health, "signals") == (True, "")
        owner.items["ns/b"] = "2"
        await publisher.publish("items", "changed", "ns/b")
        del owner.items["ns/a"]
        await publisher.publish("items", "removed", "ns/a")
        await eventually(lambda: mirror.items == {"ns/b": "2"})
        assert mirror.fetched == ["ns/b", "ns/a"]
        assert mirror.resyncs == ["items"]  # signals in order: no resync needed


async def test_a_failed_fetch_marks_the_follower_down_until_a_resync_succeeds(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    owner, health = Owner(), Health()
    hub = Signals(redis_server.url, health)
    mirror = hub.follow(Mirror(owner))
    assert isinstance(mirror, Mirror)
    publisher = Publisher(redis_client, sender="owner-1")
    async with running(hub):
        await asyncio.wait_for(mirror.synced.wait(), 5)
        owner.down = True
        owner.items["ns/a"] = "1"
        await publisher.publish("items", "changed", "ns/a")
        await eventually(lambda: not loop_state(health, "mirror")[0])
        assert "owner unreachable" in loop_state(health, "mirror")[1]
        assert not mirror.synced.is_set()
        owner.down = False  # the subscriber retries the resync with backoff
        await asyncio.wait_for(mirror.synced.wait(), 5)
        assert mirror.items == {"ns/a": "1"}
        assert loop_state(health, "mirror") == (True, "")


async def test_a_resync_signal_makes_every_follower_of_the_topic_list_again(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    owner = Owner()
    hub = Signals(redis_server.url, Health())
    mirror = hub.follow(Mirror(owner))
    assert isinstance(mirror, Mirror)
    async with running(hub):
        await asyncio.wait_for(mirror.synced.wait(), 5)
        owner.items = {"ns/x": "9"}  # changed without a signal per key
        await Publisher(redis_client, sender="owner-1").publish("items", RESYNC, "")
        await eventually(lambda: mirror.items == {"ns/x": "9"})
        assert mirror.resyncs == ["items", "items"]
        assert mirror.fetched == []


async def test_a_follower_of_two_topics_is_up_only_once_both_resynced(
    redis_server: RedisServer,
) -> None:
    owner, health = Owner(), Health()
    hub = Signals(redis_server.url, health)
    owner.down = True
    mirror = hub.follow(Mirror(owner, topics=("items", "registry")))
    assert isinstance(mirror, Mirror)
    async with running(hub):
        await eventually(lambda: len(mirror.resyncs) >= 2)
        assert not mirror.synced.is_set()
        assert loop_state(health, "mirror")[0] is False
        owner.down = False
        await asyncio.wait_for(mirror.synced.wait(), 5)
        assert set(mirror.resyncs) == {"items", "registry"}


async def test_while_pub_sub_is_away_followers_are_down_and_then_converge(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    owner, health = Owner(), Health()
    hub = Signals(redis_server.url, health, health_check_interval=0.2)
    mirror = hub.follow(Mirror(owner))
    assert isinstance(mirror, Mirror)
    async with running(hub):
        await asyncio.wait_for(mirror.synced.wait(), 5)
        redis_server.pause()  # delivery stops: the probe goes unanswered
        try:
            await eventually(lambda: not loop_state(health, "signals")[0], timeout=10)
            owner.items["ns/missed"] = "1"  # a change whose signal is never delivered
        finally:
            redis_server.resume()
        assert "signals lost" in loop_state(health, "mirror")[1]
        assert mirror.lost_count >= 1
        await eventually(lambda: mirror.items == {"ns/missed": "1"}, timeout=10)
        await asyncio.wait_for(mirror.synced.wait(), 5)
        assert loop_state(health, "signals") == (True, "")


async def test_the_outbox_keeps_signals_while_redis_is_away_and_sends_them_after(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    health = Health()
    outbox = Outbox(Publisher(redis_client, sender="owner-1"), health)
    owner = Owner()
    hub = Signals(redis_server.url, Health())
    mirror = hub.follow(Mirror(owner))
    assert isinstance(mirror, Mirror)
    assert await outbox.signal("items", "changed", "ns/a") == 1
    redis_server.stop()
    owner.items["ns/b"] = "2"
    assert await outbox.signal("items", "changed", "ns/b") == 0  # kept
    assert await outbox.signal("items", "changed", "ns/b") == 0  # once
    assert outbox.pending == 1
    assert loop_state(health, "signals out")[0] is False
    redis_server.start()
    stop = asyncio.Event()
    async with running(hub):
        await asyncio.wait_for(mirror.synced.wait(), 5)
        owner.items["ns/b"] = "3"  # only the kept signal can tell the mirror
        draining = asyncio.create_task(outbox.run(stop))
        try:
            await eventually(lambda: mirror.items.get("ns/b") == "3")
            # The subscriber may see the message before the publisher's PUBLISH returns
            # and the outbox forgets it, so the outbox is awaited, not read at once.
            await eventually(lambda: outbox.pending == 0)
            await eventually(lambda: loop_state(health, "signals out") == (True, ""))
            assert mirror.fetched == ["ns/b"]
        finally:
            stop.set()
            await asyncio.wait_for(draining, 5)


async def test_an_outbox_with_too_much_kept_sends_one_resync_instead(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    outbox = Outbox(Publisher(redis_client, sender="owner-1"), Health(), max_pending=3)
    redis_server.stop()
    for key in ("a", "b", "c", "d"):
        await outbox.signal("items", "changed", key)
    assert outbox.pending == 1  # collapsed into one resync
    await outbox.signal("items", "changed", "e")
    assert outbox.pending == 1  # the topic is resynced anyway
    redis_server.start()
    received: list[str] = []
    pubsub = redis_client.pubsub()
    await pubsub.subscribe("trellis:events:items")
    stop = asyncio.Event()
    draining = asyncio.create_task(outbox.run(stop))
    try:
        async with asyncio.timeout(5):
            while not received:  # the first message read is the subscription's confirmation
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5)
                if message is not None:
                    received.append(Event.from_json(message["data"]).kind)
        assert received == [RESYNC]
        await eventually(lambda: outbox.pending == 0)
    finally:
        stop.set()
        await asyncio.wait_for(draining, 5)
        await pubsub.aclose()  # type: ignore[no-untyped-call]


async def test_a_frozen_redis_does_not_hold_the_owner_up(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    # the client has no socket timeout: without the outbox's own, this would wait forever
    outbox = Outbox(Publisher(redis_client, sender="owner-1"), Health(), timeout=0.2)
    redis_server.pause()
    try:
        assert await outbox.signal("items", "changed", "ns/a") == 0
        assert outbox.pending == 1
    finally:
        redis_server.resume()


class Gated(Mirror):
    """A mirror whose first batch waits for ``gate``: signals pile up meanwhile."""

    def __init__(self, owner: Owner) -> None:
        super().__init__(owner)
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()
        self.batches: list[list[str]] = []

    async def changed_all(self, events: Sequence[Event]) -> None:
        self.batches.append([e.key for e in events])
        self.entered.set()
        await self.gate.wait()
        await super().changed_all(events)


async def test_signals_that_piled_up_arrive_as_one_ordered_batch(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    owner = Owner()
    hub = Signals(redis_server.url, Health())
    mirror = hub.follow(Gated(owner))
    assert isinstance(mirror, Gated)
    publisher = Publisher(redis_client, sender="owner-1")
    async with running(hub):
        await asyncio.wait_for(mirror.synced.wait(), 5)
        for key in ("a", "b", "c", "d", "e"):
            owner.items[key] = key.upper()
            await publisher.publish("items", "changed", key)
            if key == "a":
                await asyncio.wait_for(mirror.entered.wait(), 5)  # "a" is being fetched
        mirror.gate.set()
        await eventually(lambda: mirror.items == {k: k.upper() for k in "abcde"})
    assert mirror.batches[0] == ["a"]
    assert [k for batch in mirror.batches for k in batch] == ["a", "b", "c", "d", "e"]
    assert len(mirror.batches) < 5  # what waited on the socket came together
