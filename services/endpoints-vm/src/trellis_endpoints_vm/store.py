"""Durable storage of registered workloads: one Redis hash, one field per workload.

Run Redis with persistence (``make run`` does) and a restart of endpoints-vm or of Redis
loses no registration. Declared workloads (WorkloadEntry, ServiceEntry) are not stored:
their source of truth is the spec directory.

Loading never fails on one bad record. A field that is not a valid workload (truncated
JSON, a field missing, an identity that does not validate, a field name that is not the
record's id) is left out of :attr:`Loaded.workloads` and listed in :attr:`Loaded.rejected`
with the place it lives (``<hash>[<field>]``) and why, for the manager to report. It stays
in Redis until the workload registers again (the field is overwritten) or is deregistered.

Heartbeats are kept apart, in a second hash (``...:heartbeats``, workload id → the time of
its last heartbeat), because replicas write them: a registration is written by the replica
that took it, a heartbeat by whichever replica heard it, so a heartbeat never rewrites a
registration (a replica that has not yet heard of a re-registration or a deregistration
cannot put back the old one). A record's time is the later of its own ``last_heartbeat``
and the heartbeat hash's; a heartbeat whose workload is gone is ignored, and deleted with
the workload or by :meth:`RedisWorkloadStore.prune`.

A deletion leaves a tombstone (``...:tombstones``, a sorted set: workload id scored by when),
removed when the workload registers again or by :meth:`RedisWorkloadStore.prune` after a
day, or sooner when more than :data:`~trellis_endpoints_vm.keeper.TOMBSTONE_LIMIT` are kept
(the oldest go first). The leader prunes at every store check, by score and rank
(``ZREMRANGEBYSCORE``, ``ZREMRANGEBYRANK``): the cost is the tombstones that go, not those
kept. (Before, tombstones were a hash that every prune
read whole: a day of churn at 50 deregistrations per second is four million of them. The
first prune moves any such hash, ``...:deregistered``, into the sorted set.) It tells a
deregistration from a lost store: a record that is missing *with* a tombstone was
deregistered (a replica drops it), one missing *without* one was lost with Redis's data
(a replica keeps it, and the leader writes it back); and no workload is written back over
a deregistration another replica made.

Registrations and deletions are on ``min_replicas`` Redis replicas (``WAIT``, through
:func:`trellis_runtime.redisconn.replicated`) before a write returns, so one that is
acknowledged survives a failover; one that is not raises, and the keeper treats it as a
write Redis did not take. Heartbeats are not waited for: the next one, a second later,
makes up for one a failover lost.

What a store does not do is wait: bounding and queueing writes across an outage is the
:mod:`~trellis_endpoints_vm.keeper`'s job.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Collection, Sequence
from typing import Protocol

import redis.asyncio as aioredis

from trellis_endpoints_vm.domain import workloads
from trellis_runtime import redisconn, stored

log = logging.getLogger(__name__)

#: Writes of many workloads go to Redis in pipelines of this many commands.
CHUNK = 500


#: What :meth:`WorkloadStore.load_all` gives: the registrations, and those refused.
Loaded = stored.Loaded[workloads.Workload]


class WorkloadStore(Protocol):
    async def put(self, workload: workloads.Workload) -> None: ...

    async def delete(self, workload_id: str) -> None: ...

    async def write(
        self, puts: Sequence[workloads.Workload], deletes: Sequence[str] = ()
    ) -> None: ...

    async def beat(self, heartbeats: Sequence[tuple[str, float]]) -> None:
        """Record heartbeats (workload id, time): only the heartbeat hash is written."""
        ...

    async def load(self, workload_ids: Sequence[str]) -> dict[str, workloads.Workload | None]:
        """These workloads as stored now, with their last heartbeats (None: not stored, or
        a record that does not parse)."""
        ...

    async def heartbeats(self, workload_ids: Sequence[str]) -> dict[str, float]:
        """The last heartbeat stored for each of ``workload_ids`` that has one."""
        ...

    async def deregistered(self, workload_ids: Sequence[str]) -> set[str]:
        """Which of ``workload_ids`` have a tombstone: deregistered, not lost."""
        ...

    async def prune(self, tombstone_age: float, tombstone_limit: int | None = None) -> int:
        """Delete orphan heartbeats, tombstones older than ``tombstone_age`` seconds, and the
        oldest tombstones past ``tombstone_limit``; returns how many went."""
        ...

    async def load_all(self) -> Loaded: ...

    async def missing(self, workload_ids: Collection[str], extra: int = 0) -> list[str]:
        """Which of ``workload_ids`` the store does not hold (it lost them).

        ``extra`` is how many other fields the store is known to hold (rejected records), so
        a count can rule out a loss without listing every field.
        """
        ...

    async def ping(self) -> None: ...


def parse_record(field: str, raw: bytes | str) -> workloads.Workload:
    """One stored record, checked as a registration is; ``ValueError`` says what is wrong."""
    workload = workloads.validate(workloads.from_json(raw))
    if workload.id != field:
        raise ValueError(f"stored under {field!r} but the record is workload {workload.id!r}")
    return workload


class RedisWorkloadStore:
    def __init__(
        self, redis: aioredis.Redis, prefix: str = "trellis", *, min_replicas: int = 0
    ) -> None:
        self._redis = redis
        #: replicas that must have a registration or deletion before it is acknowledged
        #: (``redis_min_replicas_ack``): a failover then cannot lose it
        self._min_replicas = min_replicas
        self.key = f"{prefix}:endpoints-vm:workloads"
        self.heartbeat_key = f"{prefix}:endpoints-vm:heartbeats"
        self.tombstone_key = f"{prefix}:endpoints-vm:tombstones"
        #: where earlier versions kept tombstones (a hash): moved by the first prune
        self.legacy_tombstone_key = f"{prefix}:endpoints-vm:deregistered"

    def location(self, field: str) -> str:
        """Where a record lives, as an operator would look for it."""
        return stored.location(self.key, field)

    async def put(self, workload: workloads.Workload) -> None:
        await self._redis.hset(self.key, workload.id, workloads.to_json(workload))

    async def delete(self, workload_id: str) -> None:
        await self.write([], [workload_id])

    async def beat(self, heartbeats: Sequence[tuple[str, float]]) -> None:
        for start in range(0, len(heartbeats), CHUNK):
            chunk = heartbeats[start : start + CHUNK]
            await self._redis.hset(
                self.heartbeat_key, mapping={workload_id: repr(at) for workload_id, at in chunk}
            )

    async def heartbeats(self, workload_ids: Sequence[str]) -> dict[str, float]:
        if not workload_ids:
            return {}
        values = await self._redis.hmget(self.heartbeat_key, list(workload_ids))
        return {
            workload_id: at
            for workload_id, raw in zip(workload_ids, values, strict=True)
            if (at := _time(raw)) is not None
        }

    async def load(self, workload_ids: Sequence[str]) -> dict[str, workloads.Workload | None]:
        if not workload_ids:
            return {}
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hmget(self.key, list(workload_ids))
            pipe.hmget(self.heartbeat_key, list(workload_ids))
            records, beats = await pipe.execute()
        found: dict[str, workloads.Workload | None] = {}
        for workload_id, raw, beat in zip(workload_ids, records, beats, strict=True):
            try:
                record = None if raw is None else parse_record(workload_id, raw)
            except ValueError:
                record = None  # reported where it is loaded in full (load_all)
            found[workload_id] = None if record is None else _later(record, _time(beat))
        return found

    async def deregistered(self, workload_ids: Sequence[str]) -> set[str]:
        if not workload_ids:
            return set()
        scores = await self._redis.zmscore(self.tombstone_key, list(workload_ids))
        return {i for i, score in zip(workload_ids, scores, strict=True) if score is not None}

    async def prune(self, tombstone_age: float, tombstone_limit: int | None = None) -> int:
        pruned = 0
        if await self._redis.hlen(self.heartbeat_key) > await self._redis.hlen(self.key):
            registered = {_text(f) for f in await self._redis.hkeys(self.key)}
            beating = {_text(f) for f in await self._redis.hkeys(self.heartbeat_key)}
            orphans = sorted(beating - registered)
            if orphans:
                pruned += await self._redis.hdel(self.heartbeat_key, *orphans)
        if await self._redis.exists(self.legacy_tombstone_key):
            await self._move_legacy_tombstones()
        since = time.time() - tombstone_age
        pruned += await self._redis.zremrangebyscore(self.tombstone_key, "-inf", f"({since!r}")
        if tombstone_limit is not None:  # the oldest beyond the limit (ranks count from 0)
            pruned += await self._redis.zremrangebyrank(self.tombstone_key, 0, -tombstone_limit - 1)
        return pruned

    async def _move_legacy_tombstones(self) -> None:
        """The hash of tombstones an earlier version wrote, into the sorted set (once)."""
        legacy = await self._redis.hgetall(self.legacy_tombstone_key)
        scored = {_text(f): _time(at) or 0.0 for f, at in legacy.items()}
        async with self._redis.pipeline(transaction=True) as pipe:
            for start in range(0, len(scored), CHUNK):
                chunk = dict(itertools.islice(scored.items(), start, start + CHUNK))
                pipe.zadd(self.tombstone_key, chunk, nx=True)
            pipe.delete(self.legacy_tombstone_key)
            await pipe.execute()
        log.info("store.tombstones_moved count=%d to=%s", len(scored), self.tombstone_key)

    async def write(self, puts: Sequence[workloads.Workload], deletes: Sequence[str] = ()) -> None:
        commands = [("put", w.id, workloads.to_json(w)) for w in puts]
        commands += [("delete", workload_id, "") for workload_id in deletes]
        now = time.time()
        for start in range(0, len(commands), CHUNK):
            async with self._redis.pipeline(transaction=True) as pipe:
                for op, field, value in commands[start : start + CHUNK]:
                    if op == "put":
                        pipe.hset(self.key, field, value)
                        pipe.zrem(self.tombstone_key, field)
                    else:
                        pipe.hdel(self.key, field)
                        pipe.hdel(self.heartbeat_key, field)
                        pipe.zadd(self.tombstone_key, {field: now})
                await pipe.execute()
        if commands:
            await redisconn.replicated(self._redis, replicas=self._min_replicas)

    async def load_all(self) -> Loaded:
        loaded = await stored.load_hash(self._redis, self.key, parse_record, "workload records")
        beats = await self.heartbeats([w.id for w in loaded.records])
        return Loaded([_later(w, beats.get(w.id)) for w in loaded.records], loaded.rejected)

    async def missing(self, workload_ids: Collection[str], extra: int = 0) -> list[str]:
        if not workload_ids or await self._redis.hlen(self.key) >= len(workload_ids) + extra:
            return []
        stored = {_text(f) for f in await self._redis.hkeys(self.key)}
        absent = sorted(set(workload_ids) - stored)
        gone = await self.deregistered(absent)  # by another replica, not lost
        return [workload_id for workload_id in absent if workload_id not in gone]

    async def ping(self) -> None:
        await self._redis.ping()


def _time(raw: bytes | str | None) -> float | None:
    """A stored heartbeat time; anything that is not a number counts as none."""
    try:
        return None if raw is None else float(raw)
    except ValueError:
        return None


def _later(workload: workloads.Workload, beat: float | None) -> workloads.Workload:
    """``workload`` with the later of its own heartbeat and the stored one."""
    if beat is None or beat <= workload.last_heartbeat:
        return workload
    return workload.beat(beat)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
