"""The one event path: the owner signals on Redis, the consumer fetches over gRPC.

Every change in Trellis travels the same way (``docs/architecture.md``, "One event path")::

    owner writes the change ──► Redis signal (topic, kind, key, revision) ──► consumer
                                                                   └── gRPC Get…/List… to the owner

* The owner publishes with an :class:`Outbox`. A signal that cannot be published (Redis
  is away) is kept, deduplicated, and published when Redis is back; if too many pile up
  they collapse into one ``resync`` signal per topic. The outbox's loop is down meanwhile.
* A consumer writes a :class:`Follower` per concern (topics, ``resync``, ``changed``) and
  hands it to the service's one :class:`Signals` hub, which runs one
  :class:`~trellis_runtime.signaling.Subscriber` for all of them. On a signal the follower
  fetches what changed from the owner. After a start, a reconnect, a revision gap or a
  failed fetch it resyncs in full (the subscriber decides when, with backoff).
* The signal never carries the data: a lost signal costs a resync, never a wrong state.

Each follower is a :class:`~trellis_runtime.health.Loop`: down (with the reason) until its
first resync, while the subscription is lost, and after a failed fetch until the next
resync succeeds. ``/readyz`` and ``trellis status`` show it.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from redis.exceptions import RedisError

from trellis_common.backoff import DEFAULT_BACKOFF, Backoff, RetryCallState, failure, retrying
from trellis_runtime import lifecycle
from trellis_runtime.follow import describe
from trellis_runtime.health import Health, Loop
from trellis_runtime.locate import OwnerUnavailable
from trellis_runtime.redisconn import RedisTarget
from trellis_runtime.signaling import DEFAULT_PREFIX, Event, Publisher
from trellis_runtime.subscriber import RedisFactory, Subscriber

log = logging.getLogger(__name__)

#: The kind of signal that asks every consumer of a topic to resync in full.
RESYNC = "resync"
#: Beyond this many kept signals of a topic, the outbox sends one ``resync`` instead.
MAX_PENDING_PER_TOPIC = 1000


class Follower(abc.ABC):
    """One consumer concern: the topics it follows, and how it fetches from the owner.

    ``resync(topic)`` re-reads everything of ``topic`` from its owner; ``changed(event)``
    fetches what one signal names. Both raise on failure (the owner unreachable, an RPC
    error): the hub marks the follower down and the subscriber resyncs the topic later,
    with backoff. A record that fails validation is the follower's to reject and skip
    (``Health.rejections``), never a reason to raise. A ``resync`` signal from an owner
    reaches :meth:`resync`, not :meth:`changed`.
    """

    #: The topics this follower reads (see each owner's ``TOPIC``).
    topics: Sequence[str] = ()

    def __init__(self, what: str) -> None:
        self.what = what
        self.synced = asyncio.Event()

    @abc.abstractmethod
    async def resync(self, topic: str) -> None:
        """Re-read all of ``topic`` from its owner."""

    @abc.abstractmethod
    async def changed(self, event: Event) -> None:
        """Fetch what ``event`` says changed."""

    async def changed_all(self, events: Sequence[Event]) -> None:
        """Signals that arrived together, in order (none of kind ``resync``).

        One by one by default. A follower whose fetches are independent per key may
        override it to fetch once per key, concurrently; it must raise if any failed.
        """
        for event in events:
            await self.changed(event)

    def lost(self) -> None:  # noqa: B027 (optional hook)
        """The subscription broke: signals may be missed until the next resync."""


class Signals:
    """One service's subscription: runs every :class:`Follower` off one Redis connection."""

    def __init__(
        self,
        redis: str | RedisTarget | RedisFactory,
        health: Health,
        *,
        prefix: str = DEFAULT_PREFIX,
        health_check_interval: float = 1.0,
        client: str = "",
    ) -> None:
        self._redis = redis
        self._client = client  # names the subscriber's control channel (its ACL user's)
        self._health = health
        self._prefix = prefix
        self._interval = health_check_interval
        self._followers: list[_Entry] = []
        self.subscriber: Subscriber | None = None

    def follow(self, follower: Follower) -> Follower:
        """Add ``follower``; call before :meth:`run`."""
        if self.subscriber is not None:
            raise RuntimeError("followers are added before the hub runs")
        if not follower.topics:
            raise ValueError(f"{follower.what}: a follower needs at least one topic")
        loop = self._health.loops.register(follower.what)  # down ("starting") until resynced
        self._followers.append(_Entry(follower, loop))
        return follower

    @property
    def topics(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t for e in self._followers for t in e.follower.topics))

    async def run(self, stop: asyncio.Event) -> None:
        if not self._followers:
            return
        connection = self._health.loops.register("signals")

        def state(connected: bool, reason: str) -> None:
            if connected:
                connection.up()
                return
            connection.down(reason)
            for entry in self._followers:
                entry.resynced.clear()
                entry.follower.synced.clear()
                entry.follower.lost()
                entry.loop.down(f"signals lost: {reason}")

        self.subscriber = Subscriber(
            self._redis,
            self.topics,
            self._changed,
            self._resync,
            prefix=self._prefix,
            health_check_interval=self._interval,
            on_state=state,
            on_events=self._changed_all,
            client=self._client,
        )
        try:
            await self.subscriber.run(stop)
        finally:
            connection.close()
            for entry in self._followers:
                entry.loop.close()

    async def _resync(self, topic: str) -> None:
        failed: BaseException | None = None
        for entry in self._followers:
            follower = entry.follower
            if topic not in follower.topics:
                continue
            try:
                await follower.resync(topic)
            except Exception as exc:  # the subscriber retries the topic with backoff
                entry.failed(exc)
                log.log(
                    _level(exc),
                    "follow.resync_failed what=%s topic=%s error=%s",
                    follower.what,
                    topic,
                    describe(exc),
                    exc_info=_level(exc) == logging.ERROR,
                )
                failed = exc
                continue
            entry.resynced.add(topic)
            if entry.resynced.issuperset(follower.topics):
                entry.loop.up()
                follower.synced.set()
        if failed is not None:
            raise failed

    async def _changed(self, event: Event) -> None:
        await self._changed_all([event])

    async def _changed_all(self, events: list[Event]) -> None:
        """Deliver a batch: a ``resync`` signal resyncs its topic where it stands in the
        batch; the runs of other signals between go to each follower of their topics."""
        failed: BaseException | None = None
        run: list[Event] = []
        for event in [*events, None]:
            if event is not None and event.kind != RESYNC:
                run.append(event)
                continue
            if run:
                failed = await self._deliver(run) or failed
                run = []
            if event is not None:
                try:
                    await self._resync(event.topic)
                except Exception as exc:  # noqa: BLE001 (logged and shown by _resync)
                    failed = exc
        if failed is not None:
            raise failed

    async def _deliver(self, events: list[Event]) -> BaseException | None:
        failed: BaseException | None = None
        if log.isEnabledFor(logging.DEBUG):  # a change's trace (bench.trace) starts here
            for event in events:
                log.debug(
                    "signal.received topic=%s kind=%s key=%s revision=%s sender=%s",
                    event.topic,
                    event.kind,
                    event.key,
                    event.revision,
                    event.sender,
                )
        for entry in self._followers:
            follower = entry.follower
            mine = [e for e in events if e.topic in follower.topics]
            if not mine:
                continue
            try:
                await follower.changed_all(mine)
            except Exception as exc:  # the subscriber resyncs the topics, with backoff
                entry.failed(exc)
                entry.resynced.difference_update(e.topic for e in mine)
                first = mine[0]
                log.log(
                    _level(exc),
                    "follow.fetch_failed what=%s topic=%s key=%s signals=%d error=%s",
                    follower.what,
                    first.topic,
                    first.key,
                    len(mine),
                    describe(exc),
                    exc_info=_level(exc) == logging.ERROR,
                )
                failed = exc
        return failed


def _level(exc: BaseException) -> int:
    """A peer away is a warning; anything else is a bug, logged with its traceback."""
    expected = (grpc.aio.AioRpcError, OwnerUnavailable, RedisError, OSError, TimeoutError)
    return logging.WARNING if isinstance(exc, expected) else logging.ERROR


@dataclass
class _Entry:
    follower: Follower
    loop: Loop
    resynced: set[str] = field(default_factory=set)  # topics resynced since subscribing

    def failed(self, exc: BaseException) -> None:
        self.loop.down(describe(exc))
        self.follower.synced.clear()


class Outbox:
    """The owner's side: publish a signal, and keep it until Redis takes it.

    :meth:`signal` publishes at once when it can. When it cannot, the signal is kept
    (once per topic, kind and key, in order) and :meth:`run` publishes the backlog with
    backoff; a topic with more than ``max_pending`` kept signals sends one ``resync``
    signal instead. While anything is kept the ``signals out`` loop is down.
    """

    def __init__(
        self,
        publisher: Publisher,
        health: Health,
        *,
        max_pending: int = MAX_PENDING_PER_TOPIC,
        timeout: float = 1.0,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        self._publisher = publisher
        self._timeout = timeout
        self._max_pending = max_pending
        self._pending: dict[str, dict[tuple[str, str], None]] = {}
        self._wake = asyncio.Event()
        self._backoff = backoff
        self._loop = health.loops.register("signals out")
        self._loop.up()

    @property
    def pending(self) -> int:
        return sum(len(keys) for keys in self._pending.values())

    async def signal(self, topic: str, kind: str, key: str) -> int:
        """Publish now and return the revision, or keep the signal and return 0.

        It waits at most ``timeout`` for Redis: an owner's loop is never held up by a
        frozen or restarting Redis for longer.
        """
        if not self._pending:
            try:
                async with asyncio.timeout(self._timeout):
                    return (await self._publisher.publish(topic, kind, key)).revision
            except (RedisError, OSError, TimeoutError) as exc:
                log.warning(
                    "signal.kept topic=%s kind=%s key=%s error=%s", topic, kind, key, describe(exc)
                )
                self._loop.down(f"Redis unreachable, signals kept: {describe(exc)}")
        self._keep(topic, kind, key)
        return 0

    def _keep(self, topic: str, kind: str, key: str) -> None:
        kept = self._pending.setdefault(topic, {})
        if (RESYNC, "") in kept:
            return  # the whole topic is resynced anyway
        kept[(kind, key)] = None
        if len(kept) > self._max_pending:
            log.warning("signal.collapsed topic=%s kept=%d into=resync", topic, len(kept))
            self._pending[topic] = {(RESYNC, ""): None}
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                if not self._pending:
                    self._wake.clear()
                    await lifecycle.first(self._wake.wait(), stop.wait())
                    continue
                async for attempt in retrying(
                    stop,
                    self._backoff,
                    on=(RedisError, OSError, TimeoutError),
                    before_sleep=self._failed,
                ):
                    if stop.is_set():
                        break
                    with attempt:
                        await self._drain()
                if not self._pending:
                    self._loop.up()
                    log.info("signal.drained")
        finally:
            self._loop.close()

    def _failed(self, state: RetryCallState) -> None:
        error = failure(state)
        self._loop.down(f"Redis unreachable, {self.pending} signals kept: {describe(error)}")

    async def _drain(self) -> None:
        while self._pending:
            topic = next(iter(self._pending))
            kept = self._pending[topic]
            while kept:
                kind, key = next(iter(kept))
                async with asyncio.timeout(self._timeout * 5):
                    await self._publisher.publish(topic, kind, key)
                kept.pop((kind, key), None)
            self._pending.pop(topic, None)
