"""The subscribing half of signaling: :class:`Subscriber` (see :mod:`trellis_runtime.signaling`
for the design: revisions, gaps, resets, the barrier and the probe)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import redis.asyncio
from redis.asyncio.client import PubSub
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from trellis_common.backoff import (
    DEFAULT_BACKOFF,
    Backoff,
    RetryCallState,
    failure,
    retrying,
    start_over,
)
from trellis_runtime import redisconn
from trellis_runtime.redisconn import RedisTarget, as_target
from trellis_runtime.signaling import DEFAULT_PREFIX, Event, _text, channel_name, revision_key

log = logging.getLogger(__name__)

EventHandler = Callable[["Event"], Awaitable[None]]
BatchHandler = Callable[[list["Event"]], Awaitable[None]]
#: At most this many messages already waiting on the socket are handled as one batch.
MAX_BATCH = 256
ResyncHandler = Callable[[str], Awaitable[None]]
StateHandler = Callable[[bool, str], None]
RedisFactory = Callable[[], redis.asyncio.Redis]


class _SessionLost(Exception):
    """The subscription can no longer be trusted (silent connection, hidden reconnect)."""


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Subscriber:
    """Delivers the events of some topics, and says when to resync instead.

    ``redis`` is a URL or a :class:`~trellis_runtime.redisconn.RedisTarget` (the subscriber
    makes clients without redis-py's own retries: it reconnects itself, and must know when
    it did) or a factory returning a new client for
    each session (the subscriber closes it; a client that reconnects on its own is noticed
    and treated as a lost session).

    ``on_resync(topic)`` is called once per topic: the receiver re-reads everything for
    that topic. The event that revealed a gap or a reset is *not* also given to
    ``on_event``: the resync covers it. A failing ``on_event`` schedules a resync of its
    topic, and a failing ``on_resync`` is retried with backoff; both are logged and never
    stop the subscriber. Callbacks run one at a time, in order, on the subscriber's task;
    when ``stop`` is set a callback in progress is cancelled.

    Messages already waiting when one arrives are handled together: with ``on_events``
    they are delivered as one ordered batch (a receiver may fetch them concurrently, and
    once per key), otherwise one by one to ``on_event``.

    ``on_state(connected, reason)`` is told when the subscription is up (subscribed, before
    the resyncs) and each time it is lost or cannot be made. Callbacks log their own
    failures; the subscriber only notes them.

    Besides its topics the subscriber listens on a private control channel. It publishes
    there (on its command connection) the barrier after reading the counters, and a probe
    after ``health_check_interval`` of silence; a probe that does not come back within
    another interval means the subscription is dead. The control channel is
    ``{prefix}:subscriber:{client}:{random}``: with ``client`` set (the component's name),
    the component's Redis user may publish there and on no other subscriber's
    (:mod:`trellis_runtime.redisacl`).
    """

    def __init__(
        self,
        redis: str | RedisTarget | RedisFactory,
        topics: Iterable[str],
        on_event: EventHandler,
        on_resync: ResyncHandler,
        *,
        prefix: str = DEFAULT_PREFIX,
        backoff: Backoff = DEFAULT_BACKOFF,
        health_check_interval: float = 1.0,
        socket_timeout: float = 5.0,
        on_state: StateHandler = lambda connected, reason: None,
        on_events: BatchHandler | None = None,
        client: str = "",
    ) -> None:
        self.topics = tuple(dict.fromkeys(topics))
        if not self.topics or not all(self.topics):
            raise ValueError("a subscriber needs at least one non-empty topic")
        if isinstance(redis, str | RedisTarget):
            target = as_target(redis)
            self._factory: RedisFactory = lambda: redis_without_retries(target, socket_timeout)
        else:
            self._factory = redis
        self.prefix = prefix
        self._on_event = on_event
        self._on_resync = on_resync
        self._on_state = on_state
        self._on_events = on_events
        self._ready: list[Event] = []  # in order, not yet delivered
        self._channels = {channel_name(t, prefix): t for t in self.topics}
        self._control = ":".join(
            [prefix, "subscriber", *([client] if client else []), uuid.uuid4().hex]
        )
        self._backoff = backoff
        self._failures = 0  # connection failures since the subscription was last up
        self._interval = health_check_interval
        self._socket_timeout = socket_timeout
        self._last: dict[str, int] = dict.fromkeys(self.topics, 0)
        self._last_event: dict[str, Event] = {}
        self._retry_at: dict[str, float] = {}
        self._retry_attempts: dict[str, int] = {}
        self._early: list[Mapping[str, Any]] = []
        self._barrier: str | None = None
        self._barriers = 0
        self._replaced = False
        self._connected_at = 0.0
        self.connected = False
        self.resyncs = 0  # on_resync calls, successful or not
        self.ready = asyncio.Event()  # set after the first subscribe and resync

    def last_revision(self, topic: str) -> int:
        return self._last[topic]

    async def run(self, stop: asyncio.Event) -> None:
        worker = asyncio.create_task(self._reconnect_forever(stop), name="signaling-subscriber")
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({worker, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            worker.cancel()
            stopped.cancel()
            await asyncio.gather(worker, stopped, return_exceptions=True)
            self.connected = False

    async def _reconnect_forever(self, stop: asyncio.Event) -> None:
        clock = asyncio.get_running_loop()
        async for attempt in retrying(stop, self._backoff, before_sleep=self._lost):
            if stop.is_set():
                break
            with attempt:
                try:
                    await self._session()
                    raise _SessionLost("the session ended")  # it cannot: its read loop does not
                finally:
                    lasted = clock.time() - self._connected_at
                    if self.connected and lasted >= self._backoff.maximum:
                        start_over(attempt)  # a flapping Redis keeps backing off instead

    def _lost(self, state: RetryCallState) -> None:
        """Log a session that ended (or could not start): once per streak of failures."""
        error = failure(state)
        topics = ",".join(self.topics)
        if not isinstance(error, (RedisError, OSError, _SessionLost)):
            # a bug must not leave receivers stale forever: it is retried like an outage
            log.error("signaling.session_failed topics=%s", topics, exc_info=error)
        self._on_state(False, _describe(error))
        if self.connected:
            self.connected = False
            log.warning("signaling.disconnected topics=%s error=%s", topics, _describe(error))
            self._failures = 1
        else:
            self._failures += 1
            level = logging.WARNING if self._failures == 1 else logging.DEBUG
            log.log(level, "signaling.connect_failed topics=%s error=%s", topics, _describe(error))

    async def _session(self) -> None:
        client = self._factory()
        try:
            pubsub = client.pubsub()
            try:
                await self._subscribe(pubsub)
                self._on_state(True, "")
                await self._resync_all(client)
                self.connected = True
                self._connected_at = asyncio.get_running_loop().time()
                self.ready.set()
                log.info("signaling.subscribed topics=%s", ",".join(self.topics))
                await self._read_loop(client, pubsub)
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: untyped
        finally:
            await client.aclose()

    async def _subscribe(self, pubsub: PubSub) -> None:
        self._early = []
        self._ready = []
        self._replaced = False
        pending = {*self._channels, self._control}
        async with asyncio.timeout(self._socket_timeout):
            await pubsub.subscribe(*pending)
            while pending:
                message = await pubsub.get_message(timeout=self._socket_timeout)
                if message is None:
                    continue
                if message["type"] == "subscribe":
                    pending.discard(_text(message["channel"]))
                elif message["type"] == "message":
                    self._early.append(message)
        assert pubsub.connection is not None
        pubsub.connection.register_connect_callback(self._connection_replaced)

    def _connection_replaced(self, connection: object) -> None:
        # redis-py reconnected and resubscribed on its own: messages may have been lost.
        self._replaced = True

    async def _probe(self, client: redis.asyncio.Redis, data: str) -> None:
        async with asyncio.timeout(self._socket_timeout):
            receivers = await client.publish(self._control, data)
        if receivers == 0:
            raise _SessionLost("the server no longer has our subscription")

    async def _resync_all(self, client: redis.asyncio.Redis) -> None:
        keys = [revision_key(t, self.prefix) for t in self.topics]
        async with asyncio.timeout(self._socket_timeout):
            values = await client.mget(keys)
        for topic, value in zip(self.topics, values, strict=True):
            try:
                self._last[topic] = 0 if value is None else int(value)
            except ValueError:
                log.warning("signaling.bad_counter topic=%s value=%r", topic, value)
                self._last[topic] = 0
        self._last_event.clear()
        # Events already on their way were published before the counters were read, so
        # before this barrier: until it comes back, a revision <= the counter is stale.
        self._barriers += 1
        self._barrier = f"barrier:{self._barriers}"
        await self._probe(client, self._barrier)
        for topic in self.topics:
            await self._resync(topic, "subscribed")

    async def _read_loop(self, client: redis.asyncio.Redis, pubsub: PubSub) -> None:
        loop = asyncio.get_running_loop()
        last_heard = loop.time()
        probe_sent: float | None = None
        while True:
            if self._replaced:
                raise _SessionLost("redis-py re-established the connection underneath us")
            early, self._early = self._early, []
            for message in early:
                await self._handle(message)
            await self._flush()
            await self._retry_due_resyncs(loop.time())
            now = loop.time()
            if probe_sent is None and now - last_heard >= self._interval:
                await self._probe(client, "probe")
                probe_sent = now
            deadline = (probe_sent if probe_sent is not None else last_heard) + self._interval
            if self._retry_at:
                deadline = min(deadline, *self._retry_at.values())
            message = await pubsub.get_message(timeout=max(deadline - now, 0.001))
            now = loop.time()
            if message is None:
                if probe_sent is not None and now - probe_sent >= self._interval:
                    raise _SessionLost(f"probe not back within {self._interval}s")
                continue
            last_heard, probe_sent = now, None
            await self._handle(message)
            # what else is already waiting goes in the same batch (never waits for more)
            for _ in range(MAX_BATCH - 1):
                message = await pubsub.get_message(timeout=0.0)
                if message is None:
                    break
                await self._handle(message)
            await self._flush()

    async def _handle(self, message: Mapping[str, Any]) -> None:
        if _text(message["type"]) != "message":
            return
        channel = _text(message["channel"])
        if channel == self._control:
            if _text(message["data"]) == self._barrier:
                self._barrier = None
            return
        topic = self._channels.get(channel)
        if topic is None:
            return
        try:
            event = Event.from_json(message["data"])
            if event.topic != topic:
                raise ValueError(f"event for topic {event.topic!r} on the wrong channel")
        except ValueError as exc:
            log.warning("signaling.malformed topic=%s error=%s", topic, exc)
            return
        await self._on_revision(topic, event)

    async def _on_revision(self, topic: str, event: Event) -> None:
        last, revision = self._last[topic], event.revision
        if revision == last + 1:
            self._adopt(topic, event)
            self._ready.append(event)
        elif revision > last + 1:
            log.info("signaling.gap topic=%s last=%d revision=%d", topic, last, revision)
            self._adopt(topic, event)
            await self._flush()
            await self._resync(topic, "gap")
        elif self._barrier is not None or event == self._last_event.get(topic):
            # In flight while we read the counter, or the very same message again.
            log.debug("signaling.stale topic=%s last=%d revision=%d", topic, last, revision)
        else:
            # Revisions on one channel only ever increase: the counter was lost or reset.
            log.warning("signaling.reset topic=%s last=%d revision=%d", topic, last, revision)
            self._adopt(topic, event)
            await self._flush()
            await self._resync(topic, "reset")

    def _adopt(self, topic: str, event: Event) -> None:
        self._last[topic] = event.revision
        self._last_event[topic] = event

    async def _flush(self) -> None:
        """Deliver the events handled so far: as one batch to ``on_events`` when given (a
        failure resyncs every topic in it), else one by one to ``on_event``."""
        events, self._ready = self._ready, []
        if not events:
            return
        if self._on_events is None:
            for event in events:
                await self._deliver(event)
            return
        try:
            await self._on_events(events)
        except Exception as exc:  # noqa: BLE001 (the receiver logged it; a resync follows)
            topics = sorted({e.topic for e in events})
            log.info(
                "signaling.callback_failed callback=on_events topics=%s events=%d error=%s",
                ",".join(topics),
                len(events),
                _describe(exc),
            )
            for topic in topics:
                self._schedule_retry(topic)

    async def _deliver(self, event: Event) -> None:
        try:
            await self._on_event(event)
        except Exception as exc:  # noqa: BLE001 (the receiver logged it; a resync follows)
            log.info(
                "signaling.callback_failed callback=on_event topic=%s kind=%s key=%s revision=%d "
                "error=%s",
                event.topic,
                event.kind,
                event.key,
                event.revision,
                _describe(exc),
            )
            self._schedule_retry(event.topic)

    async def _resync(self, topic: str, reason: str) -> None:
        self.resyncs += 1
        log.info(
            "signaling.resync topic=%s reason=%s revision=%d", topic, reason, self._last[topic]
        )
        try:
            await self._on_resync(topic)
        except Exception as exc:  # noqa: BLE001 (the receiver logged it; retried)
            log.info(
                "signaling.callback_failed callback=on_resync topic=%s error=%s",
                topic,
                _describe(exc),
            )
            self._schedule_retry(topic)
        else:
            self._retry_at.pop(topic, None)
            self._retry_attempts.pop(topic, None)

    def _schedule_retry(self, topic: str) -> None:
        failures = self._retry_attempts.get(topic, 0) + 1
        self._retry_attempts[topic] = failures
        delay = self._backoff.delay(failures)
        self._retry_at[topic] = asyncio.get_running_loop().time() + delay

    async def _retry_due_resyncs(self, now: float) -> None:
        for topic, due in list(self._retry_at.items()):
            if due <= now:
                await self._resync(topic, "retry")


def redis_without_retries(
    target: str | RedisTarget, socket_timeout: float = 5.0
) -> redis.asyncio.Redis:
    """A client that reports connection errors instead of silently reconnecting.

    Through Sentinel (a ``redis+sentinel://`` URL) each new client asks the sentinels where
    the master is: after a failover the next session subscribes to the new master (and
    resyncs, as after any reconnect); while no master is known, it fails like a Redis that
    is down, and is retried with the subscriber's backoff."""
    return redisconn.client(
        target,
        retry=Retry(NoBackoff(), 0),
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_timeout,
        socket_keepalive=True,
    )
