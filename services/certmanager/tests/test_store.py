"""The Redis certificate store against a real Redis: an unreadable CA, corrupt records."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
import redis.asyncio

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.errors import CAError, StoreUnavailable
from trellis_certmanager.domain.issuer import Issuer
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.domain.sealed import Kek, Sealer
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.testing import proxy_key
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService
from trellis_runtime import redisconn
from trellis_testing import RedisServer

from .conftest import NOW

CA_KEY = "trellis:certmanager:ca"
RECORDS_KEY = "trellis:certmanager:certs"
BOOKSTORE = MeshService("bookstore", "bookstore")


SEALER = Sealer(Kek.generate())


def sealed_json(record: CertificateRecord) -> str:
    """The durable form of ``record`` as the store writes it at its own location."""
    where = f"{RECORDS_KEY}[{record.common_name}]"
    return record.to_json(lambda pem: SEALER.seal(pem, where))


@pytest.fixture
def cert_store(redis_client: redis.asyncio.Redis) -> RedisCertificateStore:
    return RedisCertificateStore(redis_client, SEALER)


async def test_the_ca_round_trips(
    cert_store: RedisCertificateStore, root_ca: CertificateAuthority
) -> None:
    assert await cert_store.load_ca() is None
    assert (await cert_store.save_ca_if_absent(root_ca)).fingerprint == root_ca.fingerprint
    loaded = await cert_store.load_ca()
    assert loaded is not None
    assert loaded.fingerprint == root_ca.fingerprint


@pytest.mark.parametrize(
    "garbage",
    [
        "not json at all",
        '{"cert_pem": "!!!not base64!!!"}',
        json.dumps({"cert_pem": "", "key_pem": "", "roots_pem": ""}),
        "[]",
    ],
)
async def test_an_unreadable_ca_names_the_key_and_the_remedy(
    cert_store: RedisCertificateStore, redis_client: redis.asyncio.Redis, garbage: str
) -> None:
    await redis_client.set(CA_KEY, garbage)
    with pytest.raises(CAError) as caught:
        await cert_store.load_ca()
    message = str(caught.value)
    assert f"Redis key {CA_KEY!r} cannot be loaded" in message
    assert "will not make a new root" in message
    assert "Restore that key from a backup" in message
    assert await redis_client.get(CA_KEY) == garbage.encode()  # left for the operator


async def test_a_ca_key_of_the_wrong_type_is_unreadable_not_absent(
    cert_store: RedisCertificateStore, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.hset(CA_KEY, "a", "b")
    with pytest.raises(CAError, match="WRONGTYPE"):
        await cert_store.load_ca()


async def test_corrupt_records_are_skipped_and_named_the_rest_loads(
    cert_store: RedisCertificateStore, redis_client: redis.asyncio.Redis, issuer: Issuer
) -> None:
    good = issuer.issue_service(BOOKSTORE, "bookstore", NOW)
    bad_account = issuer.issue_proxy(
        ProxyCommonName.new("bookstore", "bookstore"), "Bad Name!", NOW, public_key=proxy_key()
    )
    bad_pem = issuer.issue_service(MeshService("bookstore", "pem"), "bookstore", NOW)
    await cert_store.put_many([good, bad_account, replace(bad_pem, cert_chain_pem=b"garbage")])
    await redis_client.hset(
        RECORDS_KEY, "truncated.bookstore.svc.cluster.local", sealed_json(good)[:60]
    )
    await redis_client.hset(RECORDS_KEY, "elsewhere", sealed_json(good))

    loaded = await cert_store.load_all()
    assert loaded.records == [good]
    reasons = {r.key: r.reason for r in loaded.rejected}
    location = f"{RECORDS_KEY}[{{}}]".format
    assert sorted(reasons) == sorted(
        location(cn)
        for cn in (
            bad_account.common_name,
            bad_pem.common_name,
            "truncated.bookstore.svc.cluster.local",
            "elsewhere",
        )
    )
    assert "service account 'Bad Name!'" in reasons[location(bad_account.common_name)]
    assert "not a PEM certificate" in reasons[location(bad_pem.common_name)]
    assert (
        "malformed certificate record" in reasons[location("truncated.bookstore.svc.cluster.local")]
    )
    assert f"record is for {good.common_name!r}" in reasons[location("elsewhere")]

    await cert_store.delete_many(["elsewhere", bad_pem.common_name])
    assert len((await cert_store.load_all()).rejected) == 2


async def test_a_records_key_of_the_wrong_type_is_one_rejection(
    cert_store: RedisCertificateStore, redis_client: redis.asyncio.Redis
) -> None:
    await redis_client.set(RECORDS_KEY, "x")
    loaded = await cert_store.load_all()
    assert loaded.records == []
    assert [r.key for r in loaded.rejected] == [RECORDS_KEY]


async def test_a_frozen_redis_fails_a_write_with_a_clear_error_in_bounded_time(
    redis_server: RedisServer, issuer: Issuer
) -> None:
    client = redisconn.connect(redis_server.url, connect_timeout=0.3, socket_timeout=0.3)
    store = RedisCertificateStore(client, SEALER)
    record = issuer.issue_service(BOOKSTORE, "bookstore", NOW)
    try:
        await store.put(record)
        redis_server.pause()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable, match=r"the certificate store \(Redis\)"):
            await store.put(record)
        assert loop.time() - started < 1.5
    finally:
        redis_server.resume()
        await client.aclose()
