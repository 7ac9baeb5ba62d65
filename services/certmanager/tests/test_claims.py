"""Claims on common names across replicas, against a real Redis as certmanager's own user
(``claims.py``): a claim is waited for, one left by a killed replica expires, and a replica
that lost its claim cannot write."""

from __future__ import annotations

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_certmanager.claims import Claims
from trellis_certmanager.domain.errors import ClaimLost, Deposed, StoreUnavailable
from trellis_certmanager.domain.issuer import Issuer
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.store import RedisCertificateStore
from trellis_common.model import MeshService

from .conftest import NOW, SEALER

BOOKSTORE = MeshService("bookstore", "bookstore")
CN = "bookstore.bookstore.svc.cluster.local"


class Refusals:
    """A replica's refusal counter (``trellis_certmanager_replica_refused_total``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.counter = CertMetrics(self.registry).replica_refused

    def __getitem__(self, reason: str) -> float:
        sample = "trellis_certmanager_replica_refused_total"
        return self.registry.get_sample_value(sample, {"reason": reason}) or 0.0


async def test_a_replica_that_lost_its_claim_cannot_write(
    redis_client: redis.asyncio.Redis, issuer: Issuer
) -> None:
    refused = Refusals()
    a = RedisCertificateStore(redis_client, SEALER, refused=refused.counter)
    b = RedisCertificateStore(redis_client, SEALER)
    mine, theirs = (issuer.issue_service(BOOKSTORE, "bookstore", NOW) for _ in range(2))
    async with a.hold(CN) as claim:
        # a stalls past the claim's lifetime: Redis expires it, b takes the name over
        await redis_client.delete(a.claims.key(CN))
        async with b.hold(CN) as taken:
            await b.put(theirs, taken)
        with pytest.raises(ClaimLost):
            await a.put(mine, claim)
        with pytest.raises(ClaimLost):
            await a.delete_many([CN], claim)
    assert refused["claim_lost"] == 2  # logged and counted
    stored = await b.get(CN)
    assert stored is not None
    assert stored.serial == theirs.serial
    assert await redis_client.get(a.claims.key(CN)) is None  # nobody holds it now


async def test_a_claim_left_by_a_killed_replica_expires_and_is_then_taken(
    redis_client: redis.asyncio.Redis,
) -> None:
    claims = Claims(redis_client, ttl=60.0, wait=10.0)
    # a replica killed while holding the name: its claim stays until it expires
    await redis_client.set(claims.key(CN), "killed", px=200)
    async with claims.hold(CN) as claim:
        assert await redis_client.get(claims.key(CN)) == claim.token.encode()
    assert await redis_client.get(claims.key(CN)) is None


async def test_a_name_held_for_too_long_is_store_unavailable(
    redis_client: redis.asyncio.Redis,
) -> None:
    refused = Refusals()
    claims = Claims(redis_client, ttl=60.0, wait=0.05, refused=refused.counter)
    await redis_client.set(claims.key(CN), "another replica", px=60_000)
    with pytest.raises(StoreUnavailable, match="held by another certmanager replica"):
        async with claims.hold(CN):
            pass
    assert refused["busy"] == 1
    assert await redis_client.get(claims.key(CN)) == b"another replica"  # left alone


async def test_the_fence_refuses_an_older_token_and_takes_a_newer_one(
    redis_client: redis.asyncio.Redis,
) -> None:
    refused = Refusals()
    claims = Claims(redis_client, refused=refused.counter)
    await claims.take_fence(3)
    await claims.take_fence(3)  # the same leader, its next pass
    with pytest.raises(Deposed):
        await claims.take_fence(2)
    await claims.take_fence(4)
    assert await redis_client.get(claims.fence_key) == b"4"
    assert refused["deposed"] == 1
