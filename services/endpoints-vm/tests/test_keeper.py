"""The store keeper: bounded writes, queueing through an outage, flushing and refilling."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio

from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.keeper import LOOP_NAME, StoreKeeper, StoreUnavailable
from trellis_endpoints_vm.store import RedisWorkloadStore, WorkloadStore
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_runtime import redisconn
from trellis_runtime.health import Loops
from trellis_testing import RedisServer, eventually

MakeWorkload = Callable[..., Workload]
KEY = "trellis:endpoints-vm:workloads"


def keeper_for(store: WorkloadStore, memory: dict[str, Workload], **options: float) -> StoreKeeper:
    return StoreKeeper(store, memory.get, memory.keys, **options)  # type: ignore[arg-type]


async def test_writes_queue_while_down_and_the_loop_flushes_them_when_back(
    store: InMemoryWorkloadStore, make_workload: MakeWorkload
) -> None:
    memory = {"shop/vm-1": make_workload("vm-1")}
    events: list[str] = []
    keeper = StoreKeeper(
        store,
        memory.get,
        memory.keys,
        on_unavailable=lambda: events.append("down"),
        on_recovered=lambda: events.append("up"),
    )
    loops = Loops()
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop, loops))
    await eventually(lambda: [loop.name for loop in loops if loop.is_up] == [LOOP_NAME])

    store.down = True
    assert await keeper.persist("shop/vm-1")  # queued; written behind, never awaited
    await eventually(lambda: not keeper.available)  # the write behind met the outage
    assert not await keeper.persist("shop/vm-1")  # known down: queued, the caller holds it
    with pytest.raises(StoreUnavailable, match="ConnectionError: the store is down"):
        await keeper.write([make_workload("vm-2")], [])
    assert keeper.pending == {"shop/vm-1"}  # known down: the put was not even tried
    assert loops.down() == {LOOP_NAME: "redis unavailable: ConnectionError: the store is down"}

    memory["shop/vm-1"] = make_workload("vm-1", address="10.0.0.9")  # a later change wins
    store.down = False
    await eventually(lambda: keeper.available and not keeper.pending)
    assert store.workloads == {"shop/vm-1": memory["shop/vm-1"]}  # vm-2 was refused
    assert events == ["down", "up"]
    await eventually(lambda: loops.down() == {})
    stop.set()
    await asyncio.wait_for(task, 1)
    assert list(loops) == []


@pytest.fixture
async def service_client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """A client as a service makes it, with short timeouts."""
    client = redisconn.connect(redis_server.url, connect_timeout=0.5, socket_timeout=0.5)
    try:
        yield client
    finally:
        await client.aclose()


async def test_a_frozen_redis_costs_one_bounded_wait_then_none(
    redis_server: RedisServer, service_client: redis.asyncio.Redis, make_workload: MakeWorkload
) -> None:
    workload = make_workload("vm-1")
    memory = {workload.id: workload}
    keeper = keeper_for(RedisWorkloadStore(service_client), memory, timeout=0.3)
    await keeper.write([workload], [])
    redis_server.pause()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable, match="TimeoutError"):
            await keeper.write([workload], [])  # the one bounded wait
        assert loop.time() - started < 1.0
        started = loop.time()
        for _ in range(10):  # known down: no wait at all
            assert not await keeper.persist(workload.id)
        with pytest.raises(StoreUnavailable, match="TimeoutError"):
            await keeper.write([workload], [])
        assert loop.time() - started < 0.1
    finally:
        redis_server.resume()
    memory[workload.id] = workload.beat(2_000.0)
    await keeper.recover()
    assert keeper.available
    stored = await RedisWorkloadStore(service_client).load_all()
    assert stored.records == [memory[workload.id]]


async def test_the_loop_refills_a_redis_that_lost_everything(
    service_client: redis.asyncio.Redis, make_workload: MakeWorkload
) -> None:
    memory = {w.id: w for w in (make_workload(f"vm-{i}", address=f"10.0.0.{i}") for i in (1, 2))}
    store = RedisWorkloadStore(service_client)
    await store.write(list(memory.values()))
    keeper = keeper_for(store, memory, check_interval=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(keeper.run(stop))
    try:
        await service_client.flushall()
        await eventually(lambda: service_client.hlen(KEY), timeout=5)

        async def refilled() -> bool:
            loaded = (await store.load_all()).records  # in Redis' order
            return {w.id: w for w in loaded} == memory

        await eventually(refilled, timeout=5)
    finally:
        stop.set()
        await asyncio.wait_for(task, 2)
