"""The Redis workload store against a real Redis: writes, loading with corrupt records, losses."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis.asyncio

from trellis_endpoints_vm.domain.workloads import Workload, to_json
from trellis_endpoints_vm.store import RedisWorkloadStore
from trellis_runtime.stored import Rejected

MakeWorkload = Callable[..., Workload]
KEY = "trellis:endpoints-vm:workloads"


@pytest.fixture
def redis_store(redis_client: redis.asyncio.Redis) -> RedisWorkloadStore:
    return RedisWorkloadStore(redis_client)


async def test_put_write_delete_and_load(
    redis_store: RedisWorkloadStore, make_workload: MakeWorkload
) -> None:
    one, two, three = (make_workload(f"vm-{i}", address=f"10.0.0.{i}") for i in (1, 2, 3))
    await redis_store.put(one)
    await redis_store.write([two, three])
    await redis_store.write([], ["shop/vm-2"])
    await redis_store.delete("shop/vm-3")
    loaded = await redis_store.load_all()
    assert loaded.records == [one]
    assert loaded.rejected == []


async def test_corrupt_records_are_skipped_and_named_the_rest_loads(
    redis_store: RedisWorkloadStore,
    redis_client: redis.asyncio.Redis,
    make_workload: MakeWorkload,
) -> None:
    good = make_workload("vm-1")
    record = json.loads(to_json(make_workload("vm-2")))
    await redis_client.hset(
        KEY,
        mapping={
            "shop/vm-1": to_json(good),
            "shop/vm-2": to_json(make_workload("vm-2"))[:40],  # truncated
            "Bad Name!/vm-3": json.dumps({**record, "namespace": "Bad Name!", "name": "vm-3"}),
            "shop/other": to_json(make_workload("vm-4")),  # stored under the wrong id
            "shop/vm-5": b"\xff\xfe",  # not even text
            "shop/vm-6": json.dumps({**record, "name": "vm-6", "ports": [["http", 0]]}),
        },
    )
    loaded = await redis_store.load_all()
    assert loaded.records == [good]
    reasons = {r.key: r.reason for r in loaded.rejected}
    assert sorted(reasons) == [
        f"{KEY}[Bad Name!/vm-3]",
        f"{KEY}[shop/other]",
        f"{KEY}[shop/vm-2]",
        f"{KEY}[shop/vm-5]",
        f"{KEY}[shop/vm-6]",
    ]
    assert reasons[f"{KEY}[shop/vm-2]"].startswith("malformed workload record:")
    assert reasons[f"{KEY}[Bad Name!/vm-3]"].startswith("namespace:")
    assert "'shop/vm-4'" in reasons[f"{KEY}[shop/other]"]
    assert reasons[f"{KEY}[shop/vm-6]"].startswith("ports[http]:")
    assert {r.field for r in loaded.rejected} >= {"shop/vm-2", "Bad Name!/vm-3"}


async def test_a_key_of_the_wrong_type_is_one_rejection_not_a_crash(
    redis_store: RedisWorkloadStore, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.set(KEY, "not a hash")
    loaded = await redis_store.load_all()
    assert loaded.records == []
    [rejected] = loaded.rejected
    assert rejected == Rejected("", KEY, rejected.reason)
    assert "WRONGTYPE" in rejected.reason


async def test_missing_names_what_redis_lost(
    redis_store: RedisWorkloadStore,
    redis_client: redis.asyncio.Redis,
    redis_admin: redis.asyncio.Redis,
    make_workload: MakeWorkload,
) -> None:
    workloads = [make_workload(f"vm-{i}", address=f"10.0.0.{i}") for i in range(3)]
    await redis_store.write(workloads)
    ids = [w.id for w in workloads]
    assert await redis_store.missing(ids) == []
    await redis_client.hdel(KEY, "shop/vm-1")
    assert await redis_store.missing(ids) == ["shop/vm-1"]
    await redis_client.hset(KEY, "junk", "{")  # a rejected record does not hide a loss
    assert await redis_store.missing(ids, extra=1) == ["shop/vm-1"]
    await redis_admin.flushall()  # Redis lost it all (the component may not do that)
    assert await redis_store.missing(ids) == ids


async def test_tombstones_are_pruned_by_age_and_an_earlier_versions_hash_is_moved(
    redis_store: RedisWorkloadStore,
    redis_client: redis.asyncio.Redis,
    redis_admin: redis.asyncio.Redis,
    make_workload: MakeWorkload,
) -> None:
    """A deregistration's tombstone is a sorted-set member scored by its time: pruning
    takes the old ones by score (never reading every tombstone, as a hash of a day's churn
    was read at every store check), and registering again removes it."""
    workloads = [make_workload(f"vm-{i}", address=f"10.0.0.{i}") for i in range(4)]
    await redis_store.write(workloads)
    await redis_store.write([], ["shop/vm-0", "shop/vm-1", "shop/vm-2"])
    ids = [w.id for w in workloads]
    assert await redis_store.deregistered(ids) == {"shop/vm-0", "shop/vm-1", "shop/vm-2"}
    await redis_store.write([workloads[2]])  # registered again: no longer a tombstone
    assert await redis_store.deregistered(ids) == {"shop/vm-0", "shop/vm-1"}
    await redis_client.zadd(redis_store.tombstone_key, {"shop/vm-0": time.time() - 7200})
    assert await redis_store.prune(tombstone_age=3600) == 1  # vm-0's is two hours old
    assert await redis_store.deregistered(ids) == {"shop/vm-1"}

    # an earlier version's hash of tombstones (id -> time) moves into the sorted set
    legacy = redis_store.legacy_tombstone_key
    await redis_admin.hset(
        legacy, mapping={"shop/old": repr(time.time() - 7200), "shop/new": repr(time.time())}
    )
    assert await redis_store.prune(tombstone_age=3600) == 1  # shop/old, moved then pruned
    assert not await redis_client.exists(legacy)
    assert await redis_store.deregistered(["shop/old", "shop/new", "shop/vm-1"]) == {
        "shop/new",
        "shop/vm-1",
    }


async def test_tombstones_past_the_limit_go_oldest_first(
    redis_store: RedisWorkloadStore, redis_client: redis.asyncio.Redis
) -> None:
    """Heavy churn cuts the day short: at most ``tombstone_limit`` are kept, the newest."""
    now = time.time()
    await redis_client.zadd(
        redis_store.tombstone_key, {f"shop/vm-{i}": now - 60 * (5 - i) for i in range(5)}
    )
    assert await redis_store.prune(tombstone_age=3600, tombstone_limit=2) == 3
    ids = [f"shop/vm-{i}" for i in range(5)]
    assert await redis_store.deregistered(ids) == {"shop/vm-3", "shop/vm-4"}
    assert await redis_store.prune(tombstone_age=3600, tombstone_limit=2) == 0
