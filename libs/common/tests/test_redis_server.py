"""The test Redis: persistence across kill/start, and an AOF that is rewritten under churn."""

from __future__ import annotations

from pathlib import Path

import redis.asyncio

from trellis_testing import eventually
from trellis_testing.redis_backend import redis_server

KEY = "trellis:endpoints-vm:workloads"


async def persistence(client: redis.asyncio.Redis) -> dict[str, int]:
    info = await client.info("persistence")
    return {k: int(v) for k, v in info.items() if k.startswith("aof_") and isinstance(v, int)}


async def test_steady_churn_rewrites_the_aof_and_keeps_the_data(tmp_path: Path) -> None:
    """Heartbeat-like churn (the same keys rewritten again and again) on a small min size."""
    with redis_server(tmp_path / "redis", aof_rewrite_min_size="64kb") as server:
        client = redis.asyncio.Redis.from_url(server.url)
        try:
            largest = 0
            written = 0
            value: dict[str, str] = {}
            for round_ in range(400):
                value = {
                    f"shop/vm-{i}": f"{{'last_heartbeat': {round_}, 'pad': '{'x' * 60}'}}"
                    for i in range(50)
                }
                async with client.pipeline(transaction=False) as pipe:
                    for field, text in value.items():
                        pipe.hset(KEY, field, text)
                    await pipe.execute()
                written += sum(len(f) + len(t) for f, t in value.items())
                state = await persistence(client)
                largest = max(largest, state["aof_current_size"])
                if state["aof_rewrites"] >= 2:
                    break

            async def rewritten() -> dict[str, int]:
                state = await persistence(client)
                done = state["aof_rewrites"] >= 2 and not state["aof_rewrite_in_progress"]
                return state if done else {}

            state = await eventually(rewritten, timeout=20)
            assert state["aof_current_size"] < largest  # the file shrank when rewritten
            assert state["aof_current_size"] < written / 4  # and stays far below the churn
            assert (await client.info("persistence"))["aof_last_bgrewrite_status"] == "ok"
            await client.aclose()

            server.kill()
            server.start()
            client = redis.asyncio.Redis.from_url(server.url)
            assert await client.hgetall(KEY) == {k.encode(): v.encode() for k, v in value.items()}
        finally:
            await client.aclose()
