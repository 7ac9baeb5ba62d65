"""The service registry: services announce themselves so others find live providers.

Swapping an endpoints provider is deploying a different pod, so nobody is configured with
a list of providers: each service writes a :class:`ServiceRecord` under
``{prefix}:registry:{kind}:{name}`` with a TTL and refreshes it every ``ttl/3`` (the
:class:`Announcer`), and consumers :func:`discover` whoever of a kind is alive. A service
that dies stops refreshing and its key expires; one that stops cleanly deletes its key.
Because the key is rewritten at every heartbeat, a Redis that restarted (even one that
lost its data) has the key back within one interval.

Changes are also rung on the ``registry`` signaling topic (kind ``up``/``down``, key
``{kind}/{name}``). As everywhere in signaling, the bell is a hint: consumers re-run
:func:`discover` on an event and on resync; expiry rings no bell, so a consumer that
cares about dead providers also re-discovers periodically.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import re
import time
from collections.abc import Mapping
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from trellis_common.backoff import (
    DEFAULT_BACKOFF,
    Backoff,
    RetryCallState,
    failure,
    retrying,
    wait_or_stop,
)
from trellis_runtime.signaling import DEFAULT_PREFIX, Publisher

log = logging.getLogger(__name__)

REGISTRY_TOPIC = "registry"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValueError(f"{what} must match {_NAME.pattern}, got {value!r}")
    return value


def registry_key(kind: str, name: str, prefix: str = DEFAULT_PREFIX) -> str:
    return f"{prefix}:registry:{kind}:{name}"


@dataclasses.dataclass(frozen=True)
class ServiceRecord:
    """What a live service says about itself.

    ``attributes`` is a sorted tuple of ``(name, value)`` pairs so that records stay
    frozen and hashable; build one from a mapping with :meth:`create`, read it back with
    :meth:`attribute` or :attr:`attribute_map`.
    """

    kind: str
    name: str
    grpc_address: str
    admin_address: str
    started_at: float
    attributes: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        _check_name("kind", self.kind)
        _check_name("name", self.name)
        object.__setattr__(self, "attributes", tuple(sorted(dict(self.attributes).items())))

    @classmethod
    def create(
        cls,
        kind: str,
        name: str,
        grpc_address: str,
        admin_address: str = "",
        attributes: Mapping[str, str] | None = None,
        started_at: float | None = None,
    ) -> ServiceRecord:
        return cls(
            kind=kind,
            name=name,
            grpc_address=grpc_address,
            admin_address=admin_address,
            started_at=time.time() if started_at is None else started_at,
            attributes=tuple((attributes or {}).items()),
        )

    @property
    def service_id(self) -> str:
        """``{kind}/{name}``: the key of this service's registry events."""
        return f"{self.kind}/{self.name}"

    @property
    def attribute_map(self) -> dict[str, str]:
        return dict(self.attributes)

    def attribute(self, name: str, default: str | None = None) -> str | None:
        return self.attribute_map.get(name, default)

    def to_json(self) -> str:
        data: dict[str, Any] = dataclasses.asdict(self)
        data["attributes"] = self.attribute_map
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, payload: str | bytes) -> ServiceRecord:
        """Parse a record; raise ``ValueError`` saying what is wrong with a bad payload."""
        try:
            data = json.loads(payload)
        except ValueError as exc:
            raise ValueError(f"service record is not valid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"service record must be a JSON object, got {type(data).__name__}")
        strings = {}
        for field in ("kind", "name", "grpc_address", "admin_address"):
            value = data.get(field)
            if not isinstance(value, str):
                raise ValueError(f"service record field {field!r} must be a string: {value!r}")
            strings[field] = value
        started_at = data.get("started_at")
        if isinstance(started_at, bool) or not isinstance(started_at, int | float):
            raise ValueError(f"service record field 'started_at' must be a number: {started_at!r}")
        attributes = data.get("attributes", {})
        if not isinstance(attributes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
        ):
            raise ValueError(
                f"service record 'attributes' must map strings to strings: {attributes!r}"
            )
        return cls(started_at=float(started_at), attributes=tuple(attributes.items()), **strings)


class Announcer:
    """Keeps one service's record alive in the registry while ``run`` runs.

    Publishes ``up`` on the first announce and whenever the record had to be written
    anew (after a connection error, or when the key was gone: it expired or Redis lost
    it), and ``down`` after deleting the key on stop. Redis errors are logged and retried
    with backoff, never raised.
    """

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        record: ServiceRecord,
        ttl: float = 10.0,
        interval: float | None = None,
        *,
        prefix: str = DEFAULT_PREFIX,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> None:
        if ttl <= 0:
            raise ValueError("ttl must be positive")
        self.record = record
        self.ttl = ttl
        self.interval = ttl / 3 if interval is None else interval
        self.key = registry_key(record.kind, record.name, prefix)
        self._redis = redis
        self._publisher = Publisher(redis, sender=record.service_id, prefix=prefix)
        self._backoff = backoff
        self._need_up = True  # the next heartbeat that writes the record publishes "up"
        self.announced = False  # the key was written by the last heartbeat
        self.heartbeats = 0  # records written so far

    async def run(self, stop: asyncio.Event) -> None:
        self._need_up = True
        try:
            while not stop.is_set():
                async for attempt in retrying(
                    stop,
                    self._backoff,
                    on=(RedisError, OSError),
                    before_sleep=self._failed,
                ):
                    if stop.is_set():
                        break
                    with attempt:
                        await self._announce()
                await wait_or_stop(stop, self.interval)
        finally:
            await self._withdraw()

    async def _announce(self) -> None:
        async with asyncio.timeout(max(self.interval, 1.0)):
            existed = await self._heartbeat()
            self.heartbeats += 1
            if self._need_up or not existed:
                await self._publish("up")
                self._need_up = False
        if not self.announced:
            log.info("registry.announced key=%s", self.key)
        self.announced = True

    def _failed(self, state: RetryCallState) -> None:
        """Log the first failed heartbeat of a streak as a warning, the others quietly."""
        error = failure(state)
        level = logging.WARNING if state.attempt_number == 1 else logging.DEBUG
        log.log(level, "registry.heartbeat_failed key=%s error=%s", self.key, _describe(error))
        self.announced = False
        self._need_up = True

    async def _heartbeat(self) -> bool:
        """Write the record with its TTL; say whether the key was already there."""
        previous = await self._redis.set(
            self.key, self.record.to_json(), px=max(1, round(self.ttl * 1000)), get=True
        )
        return previous is not None

    async def _publish(self, kind: str) -> None:
        await self._publisher.publish(REGISTRY_TOPIC, kind, self.record.service_id)

    async def _withdraw(self) -> None:
        try:
            async with asyncio.timeout(2.0):
                await self._redis.delete(self.key)
                await self._publish("down")
            log.info("registry.withdrawn key=%s", self.key)
        except (RedisError, OSError) as exc:
            log.warning("registry.withdraw_failed key=%s error=%s", self.key, _describe(exc))
        self.announced = False


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def discover(
    redis: redis.asyncio.Redis, kind: str, prefix: str = DEFAULT_PREFIX
) -> list[ServiceRecord]:
    """The live services of ``kind``, by name. Malformed records are logged and skipped."""
    _check_name("kind", kind)
    keys = sorted(
        {
            _key_text(k)
            async for k in redis.scan_iter(match=registry_key(kind, "*", prefix), count=200)
        }
    )
    records: list[ServiceRecord] = []
    for start in range(0, len(keys), 200):
        chunk = keys[start : start + 200]
        for key, value in zip(chunk, await redis.mget(chunk), strict=True):
            if value is None:  # expired between SCAN and MGET
                continue
            try:
                record = ServiceRecord.from_json(value)
            except ValueError as exc:
                log.warning("registry.malformed key=%s error=%s", key, exc)
                continue
            if registry_key(record.kind, record.name, prefix) != key:
                log.warning(
                    "registry.malformed key=%s error=record is for %s", key, record.service_id
                )
                continue
            records.append(record)
    return records


def _key_text(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key
