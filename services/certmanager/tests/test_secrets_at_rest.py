"""Keys at rest, against a real Redis: nothing in it is a key in the clear, records an older
version wrote in the clear are sealed on load, and a planted CA is refused, never adopted."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
from dataclasses import replace
from pathlib import Path

import pytest
import redis.asyncio
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry

from trellis_certmanager.domain.authority import CertificateAuthority, generate_root
from trellis_certmanager.domain.csr import leaf_public_key, same_key
from trellis_certmanager.domain.errors import CAError, PlantedCA
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm, generate_key, key_to_pem
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.domain.sealed import Kek, Sealer
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService
from trellis_testing.bell import Bell

from .conftest import NOW, FakeClock

CA_KEY = "trellis:certmanager:ca"
RECORDS_KEY = "trellis:certmanager:certs"
SHOP = MeshService("shop", "cart")


def new_manager(store: object, bell: Bell, clock: FakeClock) -> CertificateManager:
    return CertificateManager(
        store,  # type: ignore[arg-type]
        bell,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
        clock=clock,
    )


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(Kek.generate())


@pytest.fixture
def cert_store(redis_client: redis.asyncio.Redis, sealer: Sealer) -> RedisCertificateStore:
    return RedisCertificateStore(redis_client, sealer)


def raw(value: bytes | str | None) -> bytes:
    assert isinstance(value, bytes)
    return value


async def everything_in(client: redis.asyncio.Redis) -> list[bytes]:
    values: list[bytes] = []
    async for key in client.scan_iter():
        kind = await client.type(key)
        if kind == b"string":
            values.append(raw(await client.get(key)))
        elif kind == b"hash":
            values += [raw(v) for v in (await client.hgetall(key)).values()]
        else:
            raise AssertionError(f"unexpected {kind!r} at {key!r}")
    return values


def forms_of(key_pem: bytes) -> list[bytes]:
    """What a key looks like in the clear: PEM, DER, and base64 (PEM's body, or of the PEM)."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return [b"PRIVATE KEY", der, base64.b64encode(der)[:48], base64.b64encode(key_pem)[:48]]


async def test_nothing_in_redis_is_a_key_in_the_clear(
    cert_store: RedisCertificateStore, redis_admin: redis.asyncio.Redis, bell: Bell
) -> None:
    manager = new_manager(cert_store, bell, FakeClock())
    ca = await manager.start()
    service = await manager.issue_service(SHOP)
    proxy = await manager.issue_proxy(SHOP, public_key=proxy_key())
    await manager.rotate(service.common_name)
    rotated = manager.get(service.common_name)

    values = await everything_in(redis_admin)  # every key: certmanager's user sees its own
    assert len(values) == 3  # the CA and two records
    assert proxy.key_pem == b""  # issued for a CSR: certmanager never had the proxy's key
    for key_pem in (ca.key_pem, service.key_pem, rotated.key_pem):
        for form in forms_of(key_pem):
            assert not any(form in value for value in values)
    # ...and it all reads back: a restart serves the same keys
    again = new_manager(cert_store, bell, FakeClock())
    assert (await again.start()).key_pem == ca.key_pem
    assert again.get(rotated.common_name).key_pem == rotated.key_pem
    assert again.get(proxy.common_name) == proxy


def with_its_key(common_name: ProxyCommonName, root_ca: CertificateAuthority) -> CertificateRecord:
    """A proxy record as versions before issuance by CSR made it: the key made here, kept."""
    from trellis_certmanager.domain.issuer import Issuer

    key = generate_key(KeyAlgorithm.ECDSA_P256)
    issuer = Issuer(root_ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy())
    record = issuer.issue_proxy(common_name, "cart", NOW, public_key=key.public_key())
    return replace(record, key_pem=key_to_pem(key))


async def test_a_proxy_record_stored_with_its_key_loads_and_the_key_is_dropped(
    cert_store: RedisCertificateStore,
    redis_client: redis.asyncio.Redis,
    root_ca: CertificateAuthority,
    bell: Bell,
    caplog: pytest.LogCaptureFixture,
) -> None:
    old = with_its_key(ProxyCommonName.new("cart", "shop"), root_ca)
    await cert_store.save_ca_if_absent(root_ca)
    await cert_store.put(old)  # sealed, as the previous version stored a proxy's key
    assert b"key_sealed" in raw(await redis_client.hget(RECORDS_KEY, old.common_name))

    manager = new_manager(cert_store, bell, FakeClock())
    await manager.start()
    assert manager.rejected() == []
    assert manager.get(old.common_name) == replace(old, key_pem=b"")
    stored = json.loads(raw(await redis_client.hget(RECORDS_KEY, old.common_name)))
    assert "key_sealed" not in stored
    assert "key_pem" not in stored
    assert "proxy_keys_dropped=1" in caplog.text
    rotated = await manager.rotate(old.common_name)  # re-signed for the key the proxy holds
    assert rotated.key_pem == b""
    assert same_key(leaf_public_key(rotated.cert_chain_pem), leaf_public_key(old.cert_chain_pem))


def clear_json(record: CertificateRecord) -> str:
    """A record as versions before sealing wrote it."""
    body = {**record.metadata(), "cert_chain_pem": record.cert_chain_pem.decode()}
    return json.dumps({**body, "key_pem": record.key_pem.decode()})


def clear_ca_json(ca: CertificateAuthority) -> str:
    return json.dumps({k: base64.b64encode(v).decode() for k, v in ca.to_pems().items()})


async def test_an_older_versions_clear_keys_are_read_then_sealed(
    cert_store: RedisCertificateStore,
    redis_client: redis.asyncio.Redis,
    redis_admin: redis.asyncio.Redis,
    root_ca: CertificateAuthority,
    bell: Bell,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from trellis_certmanager.domain.issuer import Issuer

    issuer = Issuer(root_ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy())
    service = issuer.issue_service(SHOP, "cart", NOW)
    proxy = with_its_key(ProxyCommonName.new("cart", "shop"), root_ca)
    await redis_client.set(CA_KEY, clear_ca_json(root_ca))
    await redis_client.hset(
        RECORDS_KEY,
        mapping={service.common_name: clear_json(service), proxy.common_name: clear_json(proxy)},
    )

    manager = new_manager(cert_store, bell, FakeClock())
    assert (await manager.start()).fingerprint == root_ca.fingerprint
    assert manager.get(service.common_name) == service
    assert manager.get(proxy.common_name) == replace(proxy, key_pem=b"")  # the key dropped
    assert manager.rejected() == []

    for value in await everything_in(redis_admin):
        assert b"PRIVATE KEY" not in value
        assert (b"tsv1:" in value) == (b'"kind":"proxy"' not in value)  # a proxy's: no key
    assert "ca.key_sealed" in caplog.text
    assert (
        "cert.keys_sealed key=trellis:certmanager:certs found_in_clear=2 under_old_kek=0 "
        "migrated=2" in caplog.text
    )
    assert "proxy_keys_dropped=1" in caplog.text
    caplog.clear()
    loaded = await cert_store.load_all()  # once sealed, nothing left to migrate
    assert sorted(r.common_name for r in loaded.records) == sorted(
        [service.common_name, proxy.common_name]
    )
    assert "keys_sealed" not in caplog.text


async def test_keys_sealed_under_another_kek_are_refused_not_replaced(
    cert_store: RedisCertificateStore, redis_client: redis.asyncio.Redis, bell: Bell
) -> None:
    manager = new_manager(cert_store, bell, FakeClock())
    await manager.start()
    record = await manager.issue_service(SHOP)
    stranger = RedisCertificateStore(redis_client, Sealer(Kek.generate()))
    with pytest.raises(CAError) as caught:
        await stranger.load_ca()
    assert f"Redis key {CA_KEY!r} cannot be loaded" in str(caught.value)
    assert "start it with the KEK file that sealed it" in str(caught.value)
    loaded = await stranger.load_all()
    assert loaded.records == []
    [rejected] = loaded.rejected
    assert rejected.key == f"{RECORDS_KEY}[{record.common_name}]"
    assert "the key cannot be unsealed: sealed under KEK" in rejected.reason


async def test_a_kek_rotation_seals_everything_again_under_the_new_kek(
    cert_store: RedisCertificateStore,
    sealer: Sealer,
    redis_client: redis.asyncio.Redis,
    redis_admin: redis.asyncio.Redis,
    bell: Bell,
    caplog: pytest.LogCaptureFixture,
) -> None:
    manager = new_manager(cert_store, bell, FakeClock())
    ca = await manager.start()
    record = await manager.issue_service(SHOP)
    new = Kek.generate()
    # certmanager started with kek_file=<new> and previous_kek_files=[<old>]
    rotated = RedisCertificateStore(redis_client, Sealer(new, [sealer.current]))
    again = new_manager(rotated, bell, FakeClock())

    assert (await again.start()).fingerprint == ca.fingerprint
    assert again.get(record.common_name).key_pem == record.key_pem
    assert "under_old_kek=1 migrated=1" in caplog.text
    assert "ca.key_sealed" in caplog.text
    sealed = [v for v in await everything_in(redis_admin) if b"tsv1:" in v]
    assert len(sealed) == 2  # the CA and the service record
    assert all(f"tsv1:{new.id}:".encode() in v for v in sealed)
    assert not any(f"tsv1:{sealer.current.id}:".encode() in v for v in sealed)
    # the old KEK can go: the new one alone reads everything
    alone = RedisCertificateStore(redis_client, Sealer(new))
    assert (await alone.load_ca()) is not None
    assert [r.common_name for r in (await alone.load_all()).records] == [record.common_name]


async def test_a_sealed_key_moved_to_another_record_is_refused(
    cert_store: RedisCertificateStore, redis_client: redis.asyncio.Redis, bell: Bell
) -> None:
    manager = new_manager(cert_store, bell, FakeClock())
    await manager.start()
    mine = await manager.issue_service(SHOP)
    theirs = await manager.issue_service(MeshService("shop", "books"))
    stolen = json.loads(raw(await redis_client.hget(RECORDS_KEY, theirs.common_name)))["key_sealed"]
    body = json.loads(raw(await redis_client.hget(RECORDS_KEY, mine.common_name)))
    await redis_client.hset(
        RECORDS_KEY, mine.common_name, json.dumps({**body, "key_sealed": stolen})
    )

    loaded = await cert_store.load_all()
    assert [r.common_name for r in loaded.records] == [theirs.common_name]
    [rejected] = loaded.rejected
    assert "copied here from another record" in rejected.reason


# --- a planted CA: someone writes another CA into Redis -------------------------------------


def other_root() -> CertificateAuthority:
    return generate_root(KeyAlgorithm.ECDSA_P256, dt.timedelta(days=365), NOW, "cluster.local")


@pytest.mark.parametrize("in_the_clear", [False, True], ids=["sealed", "in-the-clear"])
async def test_a_ca_planted_while_stopped_is_refused_at_start(
    cert_store: RedisCertificateStore,
    redis_client: redis.asyncio.Redis,
    bell: Bell,
    tmp_path: Path,
    in_the_clear: bool,
) -> None:
    marker = tmp_path / "root-fingerprint"
    ours = await new_manager(cert_store, bell, FakeClock()).start(marker=marker)
    planted = other_root()
    if in_the_clear:  # no KEK needed: the format of versions before sealing
        await redis_client.set(CA_KEY, clear_ca_json(planted))
    else:  # by someone holding the KEK
        await cert_store.replace_ca(planted)
    before = await redis_client.get(CA_KEY)

    manager = new_manager(cert_store, bell, FakeClock())
    with pytest.raises(PlantedCA) as caught:
        await manager.start(marker=marker)
    message = str(caught.value)
    assert f"has root {planted.fingerprint} but this mesh's root is {ours.fingerprint}" in message
    assert "never adopted" in message
    assert "Restore the CA key from a backup" in message
    assert not manager.ready.is_set()
    assert marker.read_text().strip() == ours.fingerprint  # the marker is not rewritten
    assert await redis_client.get(CA_KEY) == before  # left as it is for the operator


async def test_a_ca_planted_while_running_stops_the_store_guard(
    cert_store: RedisCertificateStore, bell: Bell, tmp_path: Path
) -> None:
    manager = new_manager(cert_store, bell, FakeClock())
    ours = await manager.start(marker=tmp_path / "root-fingerprint")
    await cert_store.replace_ca(other_root())
    stop = asyncio.Event()
    with pytest.raises(PlantedCA, match="found by the store guard"):
        await asyncio.wait_for(manager.guard_store(stop, interval=0.01), timeout=10)
    assert manager.ca.fingerprint == ours.fingerprint  # still serving ours, not theirs


async def test_a_ca_with_the_same_root_but_another_signer_is_refused_while_running(
    cert_store: RedisCertificateStore, bell: Bell
) -> None:
    manager = new_manager(cert_store, bell, FakeClock())
    await manager.start()
    assert not await manager.restore_if_lost()  # our own CA: nothing to do
    signer = other_root()  # names our root, signs with a key of its own
    await cert_store.replace_ca(
        CertificateAuthority(signer.cert, signer.key, (), manager.ca.roots, "generated")
    )
    with pytest.raises(CAError, match="its signer does not chain to its root"):
        await asyncio.wait_for(manager.guard_store(asyncio.Event(), interval=0.01), timeout=10)


class PlantedDuringRefill(InMemoryCertificateStore):
    """The store looks empty, then another writer's CA wins the ``SET NX`` of the refill."""

    def __init__(self, planted: CertificateAuthority) -> None:
        super().__init__()
        self.planted = planted
        self.refilling = False

    async def load_ca(self) -> CertificateAuthority | None:
        return None if self.refilling else self.ca

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        return self.planted if self.refilling else await super().save_ca_if_absent(ca)


async def test_a_ca_planted_during_a_refill_is_refused(bell: Bell) -> None:
    store = PlantedDuringRefill(other_root())
    manager = new_manager(store, bell, FakeClock())
    await manager.start()
    await manager.issue_service(SHOP)
    store.refilling, store.records = True, {}
    with pytest.raises(PlantedCA, match="found by the refill"):
        await manager.restore_if_lost()
    assert store.records == {}  # our records were not written under their CA
