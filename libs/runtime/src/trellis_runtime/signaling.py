"""Signaling: Redis pub/sub rings the bell, it never carries the data.

Services tell each other that something changed ("certificate issued", "endpoints of
``default/bookstore`` changed") with small typed :class:`Event` objects on Redis pub/sub.
Pub/sub is fire-and-forget: a subscriber that is disconnected, restarting or slow simply
misses messages. So the design never lets an event be the only copy of anything:

* An event says *what* changed (``topic``, ``kind``, ``key``), never the new value. The
  receiver re-reads the state from its owner (over gRPC) when the bell rings.
* Every topic has a revision counter in Redis (``{prefix}:rev:{topic}``). The
  :class:`Publisher` increments it and publishes in one transaction, so the revisions seen
  on one channel are consecutive and in order.
* The :class:`~trellis_runtime.subscriber.Subscriber` tracks the last revision per topic.
  Whenever it cannot be sure it saw everything it *resyncs*: it calls
  ``on_resync(topic)`` and the receiver re-reads its whole state for that topic. It
  resyncs after every successful (re)subscribe (including the first), on a revision gap,
  when the counter goes backwards (Redis lost it), and (with backoff) after a callback
  failed.

Subscribing is ordered so that nothing falls between the cracks: SUBSCRIBE (and wait for
the confirmations), then read the counters, then resync. Anything published after the
counters were read is delivered as an event; anything before is covered by the resync.
Messages already in flight when the counters were read are recognised with a barrier
message published right after the read: until it comes back, revisions at or below the
counter are stale, not a reset.

A connection error, or a subscription that stays silent after a probe (a frozen Redis or
a dead network path), ends the session: the subscriber logs it once, backs off with jitter
and starts over, which means a fresh resync. A subscriber is never left stale.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import redis.asyncio

from trellis_runtime import redisatomic

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "trellis"


def channel_name(topic: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The pub/sub channel of a topic."""
    return f"{prefix}:events:{topic}"


def revision_key(topic: str, prefix: str = DEFAULT_PREFIX) -> str:
    """The Redis key holding a topic's revision counter."""
    return f"{prefix}:rev:{topic}"


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclasses.dataclass(frozen=True)
class Event:
    """One bell ring: ``key`` of ``topic`` had ``kind`` happen at ``revision``."""

    topic: str
    kind: str
    key: str
    revision: int
    sender: str

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, payload: str | bytes) -> Event:
        """Parse an event; raise ``ValueError`` saying what is wrong with a bad payload."""
        try:
            data = json.loads(payload)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise ValueError(f"event is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"event must be a JSON object, got {type(data).__name__}")
        fields: dict[str, Any] = {}
        for name in ("topic", "kind", "key", "sender"):
            value = data.get(name)
            if not isinstance(value, str):
                raise ValueError(f"event field {name!r} must be a string, got {value!r}")
            fields[name] = value
        revision = data.get("revision")
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
            raise ValueError(f"event field 'revision' must be an integer >= 0, got {revision!r}")
        return cls(revision=revision, **fields)


class Publisher:
    """Publishes events; the counter increment and the PUBLISH are one transaction (WATCH
    the counter, then MULTI/EXEC: no script, :mod:`trellis_runtime.redisatomic`).

    ``publish`` raises Redis errors to the caller. Retrying is safe: a retried publish gets
    a new revision, and an extra bell costs a receiver one re-read.

    Revisions never go backwards while the publisher lives, even when Redis loses its
    counter (a flush, a restart without persistence): the transaction takes the highest
    revision this publisher has seen as a floor and lifts the counter above it. A consumer
    that compares revisions (skipping events already in a listing) can trust them.
    """

    def __init__(
        self, redis: redis.asyncio.Redis, sender: str, prefix: str = DEFAULT_PREFIX
    ) -> None:
        self._redis = redis
        self.sender = sender
        self.prefix = prefix
        self._floor: dict[str, int] = {}

    async def publish(self, topic: str, kind: str, key: str) -> Event:
        if not topic or not kind:
            raise ValueError("topic and kind must not be empty")
        floor = self._floor.get(topic, 0)
        counter = revision_key(topic, self.prefix)

        async def next_event(pipe: Any) -> Event:
            current = await pipe.get(counter)
            revision = max(int(current or 0), floor) + 1
            event = Event(topic=topic, kind=kind, key=key, revision=revision, sender=self.sender)
            pipe.multi()
            pipe.set(counter, revision)
            pipe.publish(channel_name(topic, self.prefix), event.to_json())
            return event

        event = await redisatomic.transact(self._redis, counter, next_event)
        self._floor[topic] = max(floor, event.revision)
        log.debug(
            "signaling.published topic=%s kind=%s key=%s revision=%d",
            topic,
            kind,
            key,
            event.revision,
        )
        return event

    async def current_revision(self, topic: str) -> int:
        value = await self._redis.get(revision_key(topic, self.prefix))
        current = max(self._floor.get(topic, 0), 0 if value is None else int(value))
        self._floor[topic] = current
        return current
