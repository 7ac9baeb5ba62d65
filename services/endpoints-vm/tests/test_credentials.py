"""Who may register, heartbeat and deregister a workload, over the real app: the admin
token or a scoped onboarding token (from a real Redis) registers; only the workload's own
heartbeat token beats; each refusal is answered, logged and counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_endpoints_vm.transport import rest
from trellis_endpoints_vm.transport.credentials import Credentials
from trellis_identity import onboarding
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_testing import RedisServer
from trellis_testing.fixtures import component_client

ADMIN = "the-admin-token"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def body(name: str = "vm-1", **overrides: Any) -> dict[str, Any]:
    return {
        "namespace": "shop",
        "name": name,
        "services": ["cart"],
        "address": "10.0.0.1",
        "ports": [{"name": "http", "number": 8080}],
        "service_account": "cart-sa",
        "ttl": 30,
        **overrides,
    }


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def store() -> InMemoryWorkloadStore:
    return InMemoryWorkloadStore()


@pytest.fixture
def tokens(redis_client: redis.asyncio.Redis) -> onboarding.TokenStore:
    """As endpoints-vm reads them (its own Redis user may only read them), counting their
    uses in its own keys."""
    return onboarding.TokenStore(redis_client, counter="endpoints-vm")


@pytest.fixture
async def issuer(redis_server: RedisServer) -> AsyncIterator[onboarding.TokenStore]:
    """As the injector makes and revokes them, as its own Redis user."""
    async with component_client(redis_server, "injector") as client:
        yield onboarding.TokenStore(client)


@pytest.fixture
async def client(
    metrics: CollectorRegistry, store: InMemoryWorkloadStore, tokens: onboarding.TokenStore
) -> AsyncIterator[httpx.AsyncClient]:
    counted = EndpointMetrics(metrics)

    manager = EndpointsManager(store, counted)
    await manager.start()
    app = admin.create_app("endpoints-vm", metrics)
    rest.add_routes(app, manager, Credentials(AdminToken.of(ADMIN), tokens, counted), lambda: {})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


def refused(metrics: CollectorRegistry, operation: str, reason: str) -> float:
    labels = {"operation": operation, "reason": reason}
    found = metrics.get_sample_value("trellis_endpoints_vm_credential_refusals_total", labels)
    return found or 0.0


async def register(client: httpx.AsyncClient, token: str = ADMIN, **overrides: Any) -> str:
    response = await client.post("/v1/workloads", json=body(**overrides), headers=bearer(token))
    assert response.status_code == 201, response.text
    assert response.headers["cache-control"] == "no-store"
    heartbeat_token: str = response.json()["heartbeat_token"]
    return heartbeat_token


async def test_the_admin_token_on_a_heartbeat_is_refused_logged_and_counted(
    client: httpx.AsyncClient, metrics: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    await register(client)
    response = await client.post("/v1/workloads/shop/vm-1/heartbeat", headers=bearer(ADMIN))
    assert response.status_code == 403
    assert response.json()["reason"] == "admin-token"
    assert "send the workload's own heartbeat token" in response.json()["detail"]
    assert refused(metrics, "heartbeat", "admin-token") == 1
    assert "workload.refused operation=heartbeat reason=admin-token workload=shop/vm-1" in (
        caplog.text
    )
    assert ADMIN not in caplog.text


async def test_another_workload_s_token_is_refused_for_heartbeat_and_deregister(
    client: httpx.AsyncClient, metrics: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    mine = await register(client, name="vm-1")
    theirs = await register(client, name="vm-2", address="10.0.0.2")
    for method, path in [
        ("POST", "/v1/workloads/shop/vm-1/heartbeat"),
        ("DELETE", "/v1/workloads/shop/vm-1"),
    ]:
        response = await client.request(method, path, headers=bearer(theirs))
        assert response.status_code == 403
        assert response.json()["reason"] == "wrong-token"
    assert refused(metrics, "heartbeat", "wrong-token") == 1
    assert refused(metrics, "deregister", "wrong-token") == 1
    assert "reason=wrong-token workload=shop/vm-1" in caplog.text
    assert theirs not in caplog.text
    # its own token beats, then takes it out
    beat = await client.post("/v1/workloads/shop/vm-1/heartbeat", headers=bearer(mine))
    assert beat.status_code == 200
    assert (await client.delete("/v1/workloads/shop/vm-1", headers=bearer(mine))).status_code == 204


async def test_registering_again_replaces_the_heartbeat_token(client: httpx.AsyncClient) -> None:
    first = await register(client)
    second = await register(client)
    assert first != second
    old = await client.post("/v1/workloads/shop/vm-1/heartbeat", headers=bearer(first))
    assert old.status_code == 403
    new = await client.post("/v1/workloads/shop/vm-1/heartbeat", headers=bearer(second))
    assert new.status_code == 200


async def test_operators_deregister_with_the_admin_token(client: httpx.AsyncClient) -> None:
    await register(client)
    gone = await client.delete("/v1/workloads/shop/vm-1", headers=bearer(ADMIN))
    assert gone.status_code == 204


async def test_a_stored_workload_without_a_token_is_refused_until_it_registers_again(
    metrics: CollectorRegistry, tokens: onboarding.TokenStore
) -> None:
    store = InMemoryWorkloadStore()
    old = Workload("shop", "old", ("cart",), "10.0.0.9", (("http", 8080),), ttl=30.0)
    await store.put(old)  # as an older version stored it: no heartbeat token
    counted = EndpointMetrics(metrics)

    manager = EndpointsManager(store, counted)
    await manager.start()
    assert manager.workload("shop/old") == old  # it loads
    app = admin.create_app("endpoints-vm", metrics)
    rest.add_routes(app, manager, Credentials(AdminToken.of(ADMIN), tokens, counted), lambda: {})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        beat = await client.post("/v1/workloads/shop/old/heartbeat", headers=bearer("anything"))
        assert beat.status_code == 403
        assert beat.json()["reason"] == "no-heartbeat-token"
        assert "register it again" in beat.json()["detail"]
        token = await register(client, name="old", address="10.0.0.9", service_account="")
        beat = await client.post("/v1/workloads/shop/old/heartbeat", headers=bearer(token))
        assert beat.status_code == 200
    assert refused(metrics, "heartbeat", "no-heartbeat-token") == 1


async def test_a_scoped_onboarding_token_registers_its_own_identity_only(
    client: httpx.AsyncClient,
    issuer: onboarding.TokenStore,
    metrics: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    token, made = await issuer.create("shop", "cart", "cart-sa", 600, uses=2)
    heartbeat_token = await register(client, token)
    beat = await client.post("/v1/workloads/shop/vm-1/heartbeat", headers=bearer(heartbeat_token))
    assert beat.status_code == 200

    others = (
        {"namespace": "billing"},
        {"service_account": "payments"},
        {"services": ["checkout"]},
        {"services": ["cart", "checkout"]},
    )
    for other in others:
        response = await client.post(
            "/v1/workloads", json=body(name="vm-2", **other), headers=bearer(token)
        )
        assert response.status_code == 403
        assert response.json()["reason"] == "wrong-identity"
        assert response.json()["token_id"] == made.id
    assert refused(metrics, "register", "wrong-identity") == 4
    assert f"operation=register reason=wrong-identity workload=shop/vm-2 token_id={made.id}" in (
        caplog.text
    )
    assert token not in caplog.text
    # an onboarding token is no heartbeat token
    beat = await client.post("/v1/workloads/shop/vm-1/heartbeat", headers=bearer(token))
    assert beat.status_code == 403


async def test_a_scoped_token_cannot_take_over_another_account_s_workload(
    client: httpx.AsyncClient, issuer: onboarding.TokenStore, metrics: CollectorRegistry
) -> None:
    await register(client, service_account="payments", services=["billing"])  # the operator
    token, _ = await issuer.create("shop", "cart", "cart-sa", 600)
    response = await client.post("/v1/workloads", json=body(), headers=bearer(token))
    assert response.status_code == 403
    assert response.json()["reason"] == "other-service-account"
    assert refused(metrics, "register", "other-service-account") == 1


async def test_revoked_and_missing_tokens_are_refused(
    client: httpx.AsyncClient, issuer: onboarding.TokenStore, metrics: CollectorRegistry
) -> None:
    token, made = await issuer.create("shop", "cart", "cart-sa", 600)
    await issuer.revoke(made.id)
    response = await client.post("/v1/workloads", json=body(), headers=bearer(token))
    assert response.status_code == 403
    assert response.json()["reason"] == "unknown-token"
    assert (await client.post("/v1/workloads", json=body())).status_code == 401
    assert (await client.post("/v1/workloads/shop/vm-1/heartbeat")).status_code == 401
    assert refused(metrics, "register", "unknown-token") == 1
    assert refused(metrics, "register", "no-token") == 1


async def test_a_token_registers_as_many_new_workloads_as_it_allows(
    client: httpx.AsyncClient, issuer: onboarding.TokenStore, metrics: CollectorRegistry
) -> None:
    token, made = await issuer.create("shop", "cart", "cart-sa", 600)
    await register(client, token)
    await register(client, token)  # the same workload again (a new heartbeat token): no use
    second = await client.post("/v1/workloads", json=body(name="vm-2"), headers=bearer(token))
    assert second.status_code == 403
    assert second.json()["reason"] == "used-up"
    assert second.json()["token_id"] == made.id
    assert refused(metrics, "register", "used-up") == 1


async def test_a_token_does_not_move_a_service_to_another_account(
    client: httpx.AsyncClient, issuer: onboarding.TokenStore, metrics: CollectorRegistry
) -> None:
    await register(client)  # the operator: cart runs as cart-sa
    token, _ = await issuer.create("shop", "cart", "intruder", 600)
    flipped = await client.post(
        "/v1/workloads",
        json=body(name="vm-2", service_account="intruder"),
        headers=bearer(token),
    )
    assert flipped.status_code == 409
    answer = flipped.json()
    assert answer["reason"] == "service-account-mismatch"
    assert "'cart-sa'" in answer["detail"]
    assert "'intruder'" in answer["detail"]
    assert refused(metrics, "register", "service-account-mismatch") == 1
    # the operator may give a service workloads of several accounts, as OSM allows
    await register(client, name="vm-3", service_account="canary-sa")
