"""certmanager's signals go through the outbox: one rung while Redis is away is kept and
published once Redis is back (``main.announce``, ``trellis_runtime.events.Outbox``)."""

from __future__ import annotations

import asyncio

import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.manager import TOPIC, CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_common.model import MeshService
from trellis_runtime.events import Outbox
from trellis_runtime.health import Health
from trellis_runtime.signaling import Event, Publisher, channel_name
from trellis_testing import RedisServer


async def test_a_rotation_signalled_while_redis_is_away_is_published_when_it_is_back(
    redis_server: RedisServer,
) -> None:
    client = redis.asyncio.Redis.from_url(redis_server.url)
    health = Health()
    outbox = Outbox(Publisher(client, sender="certmanager-0"), health)

    async def announce(kind: str, key: str) -> int:
        return await outbox.signal(TOPIC, kind, key)

    manager = CertificateManager(
        InMemoryCertificateStore(),  # the records' store is not the one that is away
        announce,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
    )
    await manager.start()
    record = await manager.issue_service(MeshService("bookstore", "bookstore"))
    assert manager.revision == 1  # published at once

    redis_server.stop()
    await manager.rotate(record.common_name)
    assert outbox.pending == 1
    assert manager.revision == 2
    assert "signals out" in health.loops.down()

    redis_server.start()
    listener = redis.asyncio.Redis.from_url(redis_server.url)
    pubsub = listener.pubsub()
    await pubsub.subscribe(channel_name(TOPIC))
    stop = asyncio.Event()
    sending = asyncio.create_task(outbox.run(stop))
    try:
        async with asyncio.timeout(10):
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                if message is not None:
                    break
    finally:
        stop.set()
        await sending
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py: untyped
        await listener.aclose()
        await client.aclose()

    event = Event.from_json(message["data"])
    assert (event.topic, event.kind, event.key) == (TOPIC, "rotated", record.common_name)
    assert outbox.pending == 0
