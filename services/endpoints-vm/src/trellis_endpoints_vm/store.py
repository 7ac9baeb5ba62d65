"""Durable storage of registered workloads: one Redis hash, one field per workload.

Run Redis with persistence (``make run`` does) and a restart of endpoints-vm or of Redis
loses no registration. Declared workloads (WorkloadEntry, ServiceEntry) are not stored:
their source of truth is the spec directory.
"""

from __future__ import annotations

import logging
from typing import Protocol

import redis.asyncio as aioredis

from trellis_endpoints_vm.domain import workloads

log = logging.getLogger(__name__)


class WorkloadStore(Protocol):
    async def put(self, workload: workloads.Workload) -> None: ...

    async def delete(self, workload_id: str) -> None: ...

    async def load_all(self) -> list[workloads.Workload]: ...


class RedisWorkloadStore:
    def __init__(self, redis: aioredis.Redis, prefix: str = "trellis") -> None:
        self._redis = redis
        self._key = f"{prefix}:endpoints-vm:workloads"

    async def put(self, workload: workloads.Workload) -> None:
        await self._redis.hset(self._key, workload.id, workloads.to_json(workload))

    async def delete(self, workload_id: str) -> None:
        await self._redis.hdel(self._key, workload_id)

    async def load_all(self) -> list[workloads.Workload]:
        found = []
        for field, raw in (await self._redis.hgetall(self._key)).items():
            try:
                found.append(workloads.from_json(raw))
            except ValueError as exc:
                log.error("store.skipped_record workload=%r error=%s", field, exc)
        return found
