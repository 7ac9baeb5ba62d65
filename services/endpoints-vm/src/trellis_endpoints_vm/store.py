"""Durable storage of registered workloads: one Redis hash, one field per workload.

Run Redis with persistence (``make run`` does) and a restart of endpoints-vm or of Redis
loses no registration. Declared workloads (WorkloadEntry, ServiceEntry) are not stored:
their source of truth is the spec directory.

Loading never fails on one bad record. A field that is not a valid workload (truncated
JSON, a field missing, an identity that does not validate, a field name that is not the
record's id) is left out of :attr:`Loaded.workloads` and listed in :attr:`Loaded.rejected`
with the place it lives (``<hash>[<field>]``) and why, for the manager to report. It stays
in Redis until the workload registers again (the field is overwritten) or is deregistered.

What a store does not do is wait: bounding and queueing writes across an outage is the
:mod:`~trellis_endpoints_vm.keeper`'s job.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Protocol

import redis.asyncio as aioredis

from trellis_common import stored
from trellis_endpoints_vm.domain import workloads

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
    def __init__(self, redis: aioredis.Redis, prefix: str = "trellis") -> None:
        self._redis = redis
        self.key = f"{prefix}:endpoints-vm:workloads"

    def location(self, field: str) -> str:
        """Where a record lives, as an operator would look for it."""
        return stored.location(self.key, field)

    async def put(self, workload: workloads.Workload) -> None:
        await self._redis.hset(self.key, workload.id, workloads.to_json(workload))

    async def delete(self, workload_id: str) -> None:
        await self._redis.hdel(self.key, workload_id)

    async def write(self, puts: Sequence[workloads.Workload], deletes: Sequence[str] = ()) -> None:
        commands = [("put", w.id, workloads.to_json(w)) for w in puts]
        commands += [("delete", workload_id, "") for workload_id in deletes]
        for start in range(0, len(commands), CHUNK):
            async with self._redis.pipeline(transaction=False) as pipe:
                for op, field, value in commands[start : start + CHUNK]:
                    if op == "put":
                        pipe.hset(self.key, field, value)
                    else:
                        pipe.hdel(self.key, field)
                await pipe.execute()

    async def load_all(self) -> Loaded:
        return await stored.load_hash(self._redis, self.key, parse_record, "workload records")

    async def missing(self, workload_ids: Collection[str], extra: int = 0) -> list[str]:
        if not workload_ids or await self._redis.hlen(self.key) >= len(workload_ids) + extra:
            return []
        stored = {_text(f) for f in await self._redis.hkeys(self.key)}
        return sorted(set(workload_ids) - stored)

    async def ping(self) -> None:
        await self._redis.ping()


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
