"""Locator: the configured address, else the registry's latest live record of a kind."""

from __future__ import annotations

import grpc
import pytest
import redis.asyncio

from trellis_runtime.locate import Locator, OwnerUnavailable
from trellis_runtime.registry import ServiceRecord, registry_key


async def announce(redis_client: redis.asyncio.Redis, name: str, address: str, at: float) -> None:
    record = ServiceRecord.create("catalog", name, address, started_at=at)
    await redis_client.set(registry_key("catalog", name), record.to_json(), px=60_000)


def unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "connect failed"
    )


async def test_no_live_owner_is_a_clear_error(redis_client: redis.asyncio.Redis) -> None:
    locator = Locator(redis_client, "catalog")
    with pytest.raises(OwnerUnavailable, match="no live catalog in the service registry"):
        await locator.locate()


async def test_the_latest_started_owner_is_found_and_found_again_after_it_moved(
    redis_client: redis.asyncio.Redis,
) -> None:
    await announce(redis_client, "catalog-a", "127.0.0.1:1001", at=100.0)
    await announce(redis_client, "catalog-b", "127.0.0.1:1002", at=200.0)
    locator = Locator(redis_client, "catalog")
    try:
        assert await locator.locate() == "127.0.0.1:1002"
        first = await locator.channel()
        assert await locator.channel() is first  # one channel while the owner answers
        await redis_client.delete(registry_key("catalog", "catalog-b"))
        locator.failed(RuntimeError("not an RPC error"))  # says nothing about the address
        assert await locator.locate() == "127.0.0.1:1002"
        locator.failed(unavailable())
        assert await locator.locate() == "127.0.0.1:1001"
        assert await locator.channel() is not first
    finally:
        await locator.close()


async def test_a_configured_address_is_kept_whatever_happens(
    redis_client: redis.asyncio.Redis,
) -> None:
    await announce(redis_client, "catalog-a", "127.0.0.1:1001", at=100.0)
    locator = Locator(redis_client, "catalog", configured="10.0.0.7:15010")
    try:
        assert await locator.locate() == "10.0.0.7:15010"
        channel = await locator.channel()
        locator.failed(unavailable())
        assert await locator.locate() == "10.0.0.7:15010"
        assert await locator.channel() is channel  # gRPC reconnects it by itself
    finally:
        await locator.close()
