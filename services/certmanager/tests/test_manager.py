"""The certificate manager: idempotent issue, rotation, CA changes, signals, recovery."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry

from trellis_certmanager import rotation
from trellis_certmanager.domain.authority import CertificateAuthority, generate_root
from trellis_certmanager.domain.csr import leaf_public_key, same_key
from trellis_certmanager.domain.errors import CAError, InvalidRequest, NotFound, StoreUnavailable
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.domain.records import CertificateKind
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.metrics import CertMetrics, EarliestExpiry
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService
from trellis_runtime.health import Rejections
from trellis_runtime.stored import Rejected
from trellis_testing import eventually
from trellis_testing.bell import Bell

from .conftest import NOW, FakeClock

BOOKSTORE = MeshService("bookstore", "bookstore")


async def test_start_creates_one_root_and_keeps_it(
    make_manager: Callable[..., CertificateManager], store: InMemoryCertificateStore
) -> None:
    first = await make_manager().start()
    second = await make_manager().start()
    assert store.ca is not None
    assert first.fingerprint == second.fingerprint == store.ca.fingerprint


async def test_issue_service_is_idempotent_until_due(
    manager: CertificateManager, clock: FakeClock, bell: Bell
) -> None:
    first = await manager.issue_service(BOOKSTORE, "bookstore")
    again = await manager.issue_service(BOOKSTORE, "bookstore")
    assert again.serial == first.serial
    assert bell.rung == [("issued", first.common_name)]
    clock.now = first.renew_after
    renewed = await manager.issue_service(BOOKSTORE, "bookstore")
    assert renewed.serial != first.serial
    assert bell.rung[-1] == ("rotated", first.common_name)
    assert len(bell.rung) == 2


async def test_changed_service_account_gets_a_new_certificate(manager: CertificateManager) -> None:
    first = await manager.issue_service(BOOKSTORE, "bookstore")
    second = await manager.issue_service(BOOKSTORE, "bookstore-v2")
    assert second.serial != first.serial
    assert second.uris == ("spiffe://cluster.local/ns/bookstore/sa/bookstore-v2",)


async def test_concurrent_requests_get_one_certificate(manager: CertificateManager) -> None:
    records = await asyncio.gather(*(manager.issue_service(BOOKSTORE) for _ in range(20)))
    assert len({r.serial for r in records}) == 1


async def test_rotate_changes_key_and_serial_and_signals_it(
    manager: CertificateManager, bell: Bell
) -> None:
    first = await manager.issue_service(BOOKSTORE)
    rotated = await manager.rotate(first.common_name)
    assert bell.rung == [("issued", first.common_name), ("rotated", first.common_name)]
    assert manager.revision == 2
    assert rotated.serial != first.serial
    assert rotated.key_pem != first.key_pem
    assert manager.get(first.common_name).serial == rotated.serial


async def test_a_signal_kept_by_the_outbox_still_moves_the_revision(
    make_manager: Callable[..., CertificateManager], bell: Bell
) -> None:
    manager = make_manager()
    await manager.start()
    kept: list[tuple[str, str]] = []

    async def outbox_without_redis(kind: str, key: str) -> int:
        kept.append((kind, key))
        return 0  # what Outbox.signal answers when it keeps the signal for later

    manager._announce = outbox_without_redis
    record = await manager.issue_service(BOOKSTORE)
    await manager.rotate(record.common_name)
    assert kept == [("issued", record.common_name), ("rotated", record.common_name)]
    assert manager.revision == 2


async def test_unknown_and_bad_names(manager: CertificateManager) -> None:
    with pytest.raises(NotFound, match="no certificate"):
        manager.get("nope.ns.svc.cluster.local")
    with pytest.raises(NotFound):
        await manager.rotate("nope")
    with pytest.raises(InvalidRequest) as caught:
        await manager.issue_proxy(BOOKSTORE, proxy_id="not-a-uuid", public_key=proxy_key())
    assert caught.value.field == "proxy_id"


async def test_proxy_certificates(manager: CertificateManager) -> None:
    record = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    assert record.kind is CertificateKind.PROXY
    assert record.common_name.endswith(".bookstore.bookstore")
    key = leaf_public_key(record.cert_chain_pem)
    again = await manager.issue_proxy(BOOKSTORE, proxy_id=record.proxy_id, public_key=key)
    assert again.serial == record.serial  # the same proxy, the same key: the same certificate
    other = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    assert other.proxy_id != record.proxy_id
    assert [r.common_name for r in manager.list(CertificateKind.PROXY)] == sorted(
        [record.common_name, other.common_name]
    )
    assert manager.list(CertificateKind.SERVICE) == []
    assert manager.list(namespace="elsewhere") == []


async def test_a_proxy_onboarded_again_with_another_key_gets_a_new_certificate(
    manager: CertificateManager, bell: Bell
) -> None:
    """One key per proxy: the certificate for the old key is revoked, not left valid."""
    record = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    new_key = proxy_key()
    again = await manager.issue_proxy(BOOKSTORE, proxy_id=record.proxy_id, public_key=new_key)
    assert again.serial != record.serial
    assert same_key(leaf_public_key(again.cert_chain_pem), new_key)
    assert again.key_pem == b""
    assert record.serial in manager.revocations
    assert bell.rung[-1] == ("revoked", record.common_name)


async def test_rotating_a_proxy_certificate_keeps_the_proxy_s_key(
    manager: CertificateManager,
) -> None:
    key = proxy_key()
    record = await manager.issue_proxy(BOOKSTORE, public_key=key)
    rotated = await manager.rotate(record.common_name)
    assert rotated.serial != record.serial
    assert same_key(leaf_public_key(rotated.cert_chain_pem), key)
    assert rotated.key_pem == b""


async def test_rotation_loop_renews_due_service_certs_and_only_warns_for_proxies(
    manager: CertificateManager, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    service = await manager.issue_service(BOOKSTORE)
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    assert await rotation.rotate_due(manager) == 0
    clock.now = service.renew_after + dt.timedelta(seconds=1)
    assert await rotation.rotate_due(manager) == 1
    assert manager.get(service.common_name).serial != service.serial
    clock.now = proxy.renew_after + dt.timedelta(seconds=1)
    warned: set[tuple[str, int]] = set()
    await rotation.rotate_due(manager, warned)
    assert manager.get(proxy.common_name).serial == proxy.serial
    assert "cert.proxy_renewal_due" in caplog.text


async def test_a_new_operator_ca_signals_root_changed_and_reissues_what_the_old_one_signed(
    make_manager: Callable[..., CertificateManager], store: InMemoryCertificateStore, bell: Bell
) -> None:
    manager = make_manager()
    await manager.start()
    old = await manager.issue_service(BOOKSTORE)
    operator = generate_root(KeyAlgorithm.ECDSA_P256, dt.timedelta(days=365), NOW, "corp")
    operator = CertificateAuthority(operator.cert, operator.key, (), operator.roots, "provided")
    restarted = make_manager()
    await restarted.start(provided=operator)
    assert store.ca is not None
    assert store.ca.fingerprint == operator.fingerprint
    assert bell.rung[-1] == ("root-changed", "root")
    assert await rotation.rotate_due(restarted) == 1
    assert bell.rung[-1] == ("rotated", old.common_name)
    fresh = x509.load_pem_x509_certificates(restarted.get(old.common_name).cert_chain_pem)[0]
    fresh.verify_directly_issued_by(operator.cert)


async def test_refuses_a_new_root_when_the_store_lost_the_old_one(
    make_manager: Callable[..., CertificateManager],
    store: InMemoryCertificateStore,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "root-fingerprint"
    ca = await make_manager().start(marker=marker)
    assert marker.read_text().strip() == ca.fingerprint
    store.ca = None
    with pytest.raises(CAError, match="store is empty"):
        await make_manager().start(marker=marker)


async def test_restores_the_store_when_it_comes_back_empty(
    manager: CertificateManager, store: InMemoryCertificateStore
) -> None:
    record = await manager.issue_service(BOOKSTORE)
    assert not await manager.restore_if_lost()
    store.ca, store.records = None, {}
    assert await manager.restore_if_lost()
    assert store.ca is not None
    assert store.ca.fingerprint == manager.ca.fingerprint
    assert store.records[record.common_name] == record


async def test_a_requested_validity_is_honoured_once_not_on_every_call(
    manager: CertificateManager,
) -> None:
    first = await manager.issue_service(BOOKSTORE, validity=dt.timedelta(hours=24))
    assert dt.timedelta(hours=21) < first.lifetime < dt.timedelta(hours=27)
    again = await manager.issue_service(BOOKSTORE, validity=dt.timedelta(hours=24))
    assert again.serial == first.serial
    longer = await manager.issue_service(BOOKSTORE, validity=dt.timedelta(hours=72))
    assert longer.serial != first.serial
    assert longer.lifetime > dt.timedelta(hours=60)


# --- corrupt state: an unreadable CA stops us, bad records are skipped and reported ---------


class UnreadableCAStore(InMemoryCertificateStore):
    """A store whose CA key holds garbage, as RedisCertificateStore reports it."""

    async def load_ca(self) -> CertificateAuthority | None:
        raise CAError("the CA stored in Redis key 'trellis:certmanager:ca' cannot be loaded")


async def test_an_unreadable_ca_is_fatal_and_keeps_the_marker(
    bell: Bell, clock: FakeClock, tmp_path: Path
) -> None:
    marker = tmp_path / "root-fingerprint"
    marker.write_text("abc123\n")
    store = UnreadableCAStore()
    manager = CertificateManager(
        store,
        bell,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
        clock=clock,
    )
    with pytest.raises(CAError, match="trellis:certmanager:ca"):
        await manager.start(marker=marker)
    assert marker.read_text() == "abc123\n"
    assert store.ca is None  # no root was made in its place
    assert not manager.ready.is_set()


async def test_an_unreadable_ca_is_replaced_by_the_operator_s_ca_files(
    bell: Bell, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    store = UnreadableCAStore()
    manager = CertificateManager(
        store,
        bell,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
        clock=clock,
    )
    operator = generate_root(KeyAlgorithm.ECDSA_P256, dt.timedelta(days=365), NOW, "corp")
    ca = await manager.start(provided=operator)
    assert ca is operator
    assert store.ca is operator
    assert bell.rung == [("root-changed", "root")]  # a root was on record, unreadable
    assert "ca.unreadable" in caplog.text
    assert "action=replacing-with-operator-ca" in caplog.text


async def test_records_refused_at_load_are_reported_never_served_and_can_go(
    store: InMemoryCertificateStore,
    bell: Bell,
    clock: FakeClock,
    root_ca: CertificateAuthority,
) -> None:
    store.ca = root_ca
    proxy_cn = ProxyCommonName.new("bookstore", "bookstore")
    service_cn = "bookstore.bookstore.svc.cluster.local"
    store.rejected = [
        Rejected(proxy_cn.format(), f"certs[{proxy_cn}]", "service account 'Bad Name!' ..."),
        Rejected(service_cn, f"certs[{service_cn}]", "malformed certificate record"),
        Rejected("junk", "certs[junk]", "malformed certificate record"),
    ]
    rejections = Rejections()
    manager = CertificateManager(
        store,
        bell,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
        clock=clock,
        rejections=rejections,
    )
    await manager.start()
    assert manager.list() == []
    with pytest.raises(NotFound):
        manager.get(service_cn)
    assert sorted(r.key for r in rejections.items()) == sorted(
        f"certs[{cn}]" for cn in (proxy_cn.format(), service_cn, "junk")
    )

    # re-issuing overwrites the bad record; the operator deletes the one nobody re-issues
    proxy = await manager.issue_proxy(BOOKSTORE, proxy_id=proxy_cn.proxy_id, public_key=proxy_key())
    service = await manager.issue_service(BOOKSTORE)
    assert (proxy.common_name, service.common_name) == (proxy_cn.format(), service_cn)
    assert manager.rejected() == ["junk"]
    await manager.delete_rejected("junk")
    with pytest.raises(NotFound):
        await manager.delete_rejected(service_cn)  # a valid record is not deleted this way
    assert manager.rejected() == []
    assert len(rejections) == 0
    assert store.rejected == []
    assert sorted(store.records) == sorted([proxy_cn.format(), service_cn])


async def test_a_restored_store_forgets_the_records_it_lost(
    store: InMemoryCertificateStore, bell: Bell, clock: FakeClock, root_ca: CertificateAuthority
) -> None:
    store.ca = root_ca
    store.rejected = [Rejected("junk", "certs[junk]", "malformed")]
    rejections = Rejections()
    manager = CertificateManager(
        store,
        bell,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
        clock=clock,
        rejections=rejections,
    )
    await manager.start()
    store.ca, store.rejected = None, []  # Redis came back empty
    assert await manager.restore_if_lost()
    assert manager.rejected() == []
    assert len(rejections) == 0


# --- pruning: records long past expiry leave the store and memory --------------------------


async def test_records_past_expiry_and_grace_are_pruned_by_the_rotation_pass(
    make_manager: Callable[..., CertificateManager],
    store: InMemoryCertificateStore,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="trellis_certmanager.manager")
    manager = make_manager(proxy_validity=dt.timedelta(days=2))
    await manager.start()
    ca = store.ca
    old = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    clock.advance(dt.timedelta(days=1))
    young = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    service = await manager.issue_service(BOOKSTORE)

    clock.now = old.not_after + dt.timedelta(hours=23)  # expired, within the grace
    assert await manager.prune_expired() == 0
    clock.now = old.not_after + dt.timedelta(days=1)
    stop = asyncio.Event()
    task = asyncio.create_task(rotation.run(manager, stop, interval=0.01))
    try:
        await eventually(lambda: old.common_name not in store.records)
    finally:
        stop.set()
        await asyncio.wait_for(task, 1)
    with pytest.raises(NotFound):
        manager.get(old.common_name)
    assert manager.get(young.common_name) == young  # expired less than a day ago
    assert manager.get(service.common_name).serial != service.serial  # rotated, not pruned
    assert sorted(store.records) == sorted([young.common_name, service.common_name])
    assert store.ca is ca  # never the CA
    assert "cert.pruned_expired count=1" in caplog.text


async def test_a_record_re_issued_meanwhile_is_not_pruned(
    make_manager: Callable[..., CertificateManager],
    store: InMemoryCertificateStore,
    clock: FakeClock,
) -> None:
    manager = make_manager(proxy_validity=dt.timedelta(days=2))
    await manager.start()
    old = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    clock.now = old.not_after + dt.timedelta(days=2)
    fresh = await manager.issue_proxy(
        BOOKSTORE, proxy_id=old.proxy_id, public_key=proxy_key()
    )  # expired: re-issued
    assert await manager.prune_expired() == 0
    assert store.records[old.common_name] == fresh


# --- Redis outages: reads from memory, writes refused cleanly --------------------------------


async def test_while_the_store_is_down_reads_work_and_writes_change_nothing(
    manager: CertificateManager,
    store: InMemoryCertificateStore,
    clock: FakeClock,
    bell: Bell,
    caplog: pytest.LogCaptureFixture,
) -> None:
    record = await manager.issue_service(BOOKSTORE)
    other = await manager.issue_service(MeshService("bookstore", "other"))
    store.down = True
    assert await manager.issue_service(BOOKSTORE) == record  # still good: served from memory
    assert manager.get(record.common_name) == record
    with pytest.raises(StoreUnavailable, match="Redis"):
        await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    with pytest.raises(StoreUnavailable):
        await manager.rotate(record.common_name)
    assert manager.get(record.common_name) == record
    assert len(manager.list()) == 2
    assert len(bell.rung) == 2

    clock.now = max(record.renew_after, other.renew_after)
    assert await rotation.rotate_due(manager) == 0  # deferred: one warning, not one per record
    assert caplog.text.count("cert.rotation_deferred") == 1
    store.down = False
    assert await rotation.rotate_due(manager) == 2


async def test_a_service_certificate_nobody_asks_for_expires_and_is_pruned(
    make_manager: Callable[..., CertificateManager],
    store: InMemoryCertificateStore,
    clock: FakeClock,
) -> None:
    """The certificate of a service that is gone is not rotated forever."""
    manager = make_manager(service_validity=dt.timedelta(hours=48), jitter=0.0)
    await manager.start()
    gone = await manager.issue_service(BOOKSTORE)
    kept = await manager.issue_service(MeshService("bookbuyer", "bookbuyer"))

    # due: both were asked for when issued, so both are rotated once
    clock.now = gone.not_before + dt.timedelta(hours=40)
    assert await rotation.rotate_due(manager) == 2
    rotated = store.records[gone.common_name]  # (manager.get would count as asking for it)
    assert rotated.serial != gone.serial

    # from now on only bookbuyer's is asked for (as the catalog does for live identities)
    clock.now = rotated.not_before + dt.timedelta(hours=40)
    renewed = await manager.issue_service(MeshService("bookbuyer", "bookbuyer"))  # due: renewed
    assert renewed.serial not in (kept.serial, rotated.serial)
    assert await rotation.rotate_due(manager) == 0  # bookstore's: nobody asked since it was issued
    assert store.records[gone.common_name] == rotated

    clock.now = rotated.not_after + dt.timedelta(days=1, seconds=1)
    assert await manager.prune_expired() == 1
    assert gone.common_name not in store.records
    assert kept.common_name in store.records


async def test_the_earliest_expiry_of_each_kind_is_read_at_scrape_time(
    manager: CertificateManager, clock: FakeClock
) -> None:
    registry = CollectorRegistry()
    registry.register(EarliestExpiry(manager.records))
    name = "trellis_certmanager_earliest_certificate_expiration_timestamp_seconds"
    assert registry.get_sample_value(name, {"kind": "proxy"}) is None  # nothing on record
    first = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    clock.advance(dt.timedelta(hours=1))
    await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())  # expires an hour later
    service = await manager.issue_service(BOOKSTORE)
    assert registry.get_sample_value(name, {"kind": "proxy"}) == first.not_after.timestamp()
    assert registry.get_sample_value(name, {"kind": "service"}) == service.not_after.timestamp()
