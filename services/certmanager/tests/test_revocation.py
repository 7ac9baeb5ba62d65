"""Revocation: an operator's revoke, a proxy rotation's old serial, durability, pruning,
and the REST and gRPC faces."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from functools import partial

import grpc
import httpx
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.domain.errors import NotFound, NotRevocable, StoreUnavailable
from trellis_certmanager.domain.revocation import Revocation, RevocationReason
from trellis_certmanager.domain.sealed import Kek, Sealer
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_certmanager.transport import rest
from trellis_certmanager.transport.grpc_api import SERVICE_NAME, CertificateManagerServicer
from trellis_common.model import MeshService
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_testing.bell import Bell
from trellis_testing.servicer import served

from .conftest import FakeClock

BOOKSTORE = MeshService("bookstore", "bookstore")
TOKEN = "s3cret-token"


def counted(manager: CertificateManager, reason: str) -> float:
    return float(manager._metrics.revocations.labels(reason)._value.get())


async def test_revoke_remembers_the_serial_deletes_the_record_and_signals(
    manager: CertificateManager, store: InMemoryCertificateStore, bell: Bell
) -> None:
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    revocation = await manager.revoke(proxy.common_name)
    assert (revocation.serial, revocation.reason) == (proxy.serial, RevocationReason.REVOKED)
    assert revocation.not_after == proxy.not_after
    assert proxy.serial in manager.revocations
    assert store.revoked[proxy.serial] == revocation
    assert proxy.common_name not in store.records
    with pytest.raises(NotFound):
        manager.get(proxy.common_name)
    assert bell.rung[-1] == ("revoked", proxy.common_name)
    assert counted(manager, "revoked") == 1
    again = await manager.issue_proxy(
        BOOKSTORE, proxy.proxy_id, public_key=proxy_key()
    )  # onboarding it again
    assert again.serial != proxy.serial
    assert again.serial not in manager.revocations


async def test_only_proxy_certificates_on_record_are_revoked(
    manager: CertificateManager, bell: Bell
) -> None:
    service = await manager.issue_service(BOOKSTORE)
    with pytest.raises(NotRevocable, match="service certificate"):
        await manager.revoke(service.common_name)
    with pytest.raises(NotFound):
        await manager.revoke("123e4567-e89b-42d3-a456-426614174000.bookstore.bookstore")
    assert manager.revocations.list() == []
    assert [kind for kind, _ in bell.rung] == ["issued"]


async def test_rotating_a_proxy_certificate_revokes_the_old_serial(
    manager: CertificateManager, bell: Bell
) -> None:
    first = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    second = await manager.rotate(first.common_name)
    assert first.serial in manager.revocations
    assert second.serial not in manager.revocations
    [revoked] = manager.revocations.list(first.common_name)
    assert revoked.reason is RevocationReason.ROTATED
    assert bell.rung[-2:] == [("rotated", first.common_name), ("revoked", first.common_name)]
    assert manager.get(first.common_name).serial == second.serial  # still expected
    assert counted(manager, "rotated") == 1


async def test_rotating_a_service_certificate_revokes_nothing(manager: CertificateManager) -> None:
    service = await manager.issue_service(BOOKSTORE)
    await manager.rotate(service.common_name)
    assert manager.revocations.list() == []


async def test_revocations_survive_a_restart_and_are_pruned_after_expiry(
    manager: CertificateManager,
    make_manager: Callable[..., CertificateManager],
    clock: FakeClock,
) -> None:
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    await manager.revoke(proxy.common_name)
    restarted = make_manager()
    await restarted.start()
    assert proxy.serial in restarted.revocations
    clock.now = proxy.not_after + dt.timedelta(hours=23)  # within the day of grace
    await restarted.prune_expired()
    assert proxy.serial in restarted.revocations
    clock.now = proxy.not_after + dt.timedelta(days=1)
    await restarted.prune_expired()
    assert restarted.revocations.list() == []
    fresh = make_manager()  # pruned from the store too
    await fresh.start()
    assert fresh.revocations.list() == []


async def test_a_revocation_redis_does_not_take_changes_nothing(
    manager: CertificateManager, store: InMemoryCertificateStore, bell: Bell
) -> None:
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    store.down = True
    with pytest.raises(StoreUnavailable):
        await manager.revoke(proxy.common_name)
    assert proxy.serial not in manager.revocations
    assert manager.get(proxy.common_name).serial == proxy.serial
    assert bell.rung[-1] == ("issued", proxy.common_name)


async def test_the_redis_store_keeps_revocations_and_refuses_corrupt_ones(
    redis_client: redis.asyncio.Redis, manager: CertificateManager
) -> None:
    store = RedisCertificateStore(redis_client, Sealer(Kek.generate()))
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    revocation = Revocation(
        proxy.serial, proxy.common_name, proxy.not_after, proxy.not_before, RevocationReason.REVOKED
    )
    await store.put_revoked(revocation)
    await redis_client.hset(store.revoked_key, "abc", revocation.to_json())  # under another serial
    await redis_client.hset(store.revoked_key, "def", "{not json")
    loaded = await store.load_revoked()
    assert loaded.records == [revocation]
    reasons = {r.field: r.reason for r in loaded.rejected}
    assert "stored under 'abc'" in reasons["abc"]
    assert "malformed revocation" in reasons["def"]
    await store.delete_revoked([proxy.serial])
    assert (await store.load_revoked()).records == []


@pytest.fixture
async def admin_client(manager: CertificateManager) -> AsyncIterator[httpx.AsyncClient]:
    app = admin.create_app("certmanager", CollectorRegistry(), {"ca": manager.ready.is_set})
    rest.add_routes(app, manager, admin.token_guard(AdminToken.of(TOKEN)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


async def test_rest_revoke_needs_the_token_and_answers_the_revocation(
    admin_client: httpx.AsyncClient, manager: CertificateManager
) -> None:
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    path = f"/v1/certificates/{proxy.common_name}/revoke"
    assert (await admin_client.post(path)).status_code == 401
    assert proxy.serial not in manager.revocations
    auth = {"Authorization": f"Bearer {TOKEN}"}
    response = await admin_client.post(path, headers=auth)
    assert response.status_code == 200
    body = response.json()
    assert (body["revoked"], body["serial"], body["reason"]) == (
        True,
        f"{proxy.serial:x}",
        "revoked",
    )
    again = await admin_client.post(path, headers=auth)
    assert again.status_code == 404
    service = await manager.issue_service(BOOKSTORE)
    refused = await admin_client.post(
        f"/v1/certificates/{service.common_name}/revoke", headers=auth
    )
    assert refused.status_code == 409
    assert "only proxy certificates" in refused.json()["detail"]
    listed = (await admin_client.get("/v1/revoked")).json()["revoked"]
    assert [r["common_name"] for r in listed] == [proxy.common_name]


async def test_grpc_lists_revoked_serials(manager: CertificateManager) -> None:
    first = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    other = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    await manager.rotate(first.common_name)
    await manager.revoke(other.common_name)
    servicer = CertificateManagerServicer(manager)
    register = partial(pb_grpc.add_CertificateManagerServicer_to_server, servicer)
    async with served(register, SERVICE_NAME) as channel:
        stub: pb_grpc.CertificateManagerAsyncStub = pb_grpc.CertificateManagerStub(channel)
        every = await stub.ListRevokedCertificates(pb.ListRevokedCertificatesRequest())
        assert {(r.common_name, r.reason) for r in every.revoked} == {
            (first.common_name, "rotated"),
            (other.common_name, "revoked"),
        }
        one = await stub.ListRevokedCertificates(
            pb.ListRevokedCertificatesRequest(common_name=other.common_name)
        )
        assert [r.serial for r in one.revoked] == [f"{other.serial:x}"]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListRevokedCertificates(
                pb.ListRevokedCertificatesRequest(common_name="not a name")
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "common_name" in (refused.value.details() or "")
