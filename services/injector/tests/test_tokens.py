"""Scoped onboarding tokens over the real app and a real Redis: made, listed and revoked
with the admin token; each onboards its own identity only, and every refusal is logged
and counted."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_identity import onboarding
from trellis_identity.tokens import AdminToken
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder, Unavailable
from trellis_injector.testing import FakeCatalog, FakeCertificates, FixedControlPlane
from trellis_injector.transport import rest
from trellis_runtime import admin

from .test_rest import AUTH, SPIFFE, TOKEN, body, injector_redis

__all__ = ["injector_redis"]  # the fixture, shared with test_rest


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def certificates() -> FakeCertificates:
    return FakeCertificates()


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def client(
    injector_redis: redis.asyncio.Redis,
    certificates: FakeCertificates,
    metrics: CollectorRegistry,
    clock: Clock,
) -> AsyncIterator[httpx.AsyncClient]:
    app = admin.create_app("injector", metrics)
    onboarder = Onboarder(certificates, FakeCatalog(), FixedControlPlane(), SPIFFE)
    store = onboarding.TokenStore(injector_redis, clock=clock)
    rest.add_routes(
        app,
        onboarder,
        admin.token_guard(AdminToken.of(TOKEN)),
        AdminToken.of(TOKEN),
        store,
        InjectorMetrics(metrics),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


async def create(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    asked = {"namespace": "shop", "service": "cart", "service_account": "cart-sa", **fields}
    response = await client.post("/v1/tokens", json=asked, headers=AUTH)
    assert response.status_code == 201, response.text
    answer: dict[str, Any] = response.json()
    return answer


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sample(metrics: CollectorRegistry, name: str, **labels: str) -> float:
    return metrics.get_sample_value(name, labels) or 0.0


def refusals(metrics: CollectorRegistry, reason: str) -> float:
    return sample(metrics, "trellis_injector_onboarding_refusals_total", reason=reason)


async def test_a_token_is_shown_once_and_stored_as_a_digest_only(
    client: httpx.AsyncClient, redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    made = await create(client, ttl_seconds=600.0)
    token = made["token"]
    assert token.startswith("trellis-onb.")
    assert (made["namespace"], made["service"], made["service_account"]) == (
        "shop", "cart", "cart-sa",
    )  # fmt: skip
    assert made["uses"] == 1
    assert made["expires_at"] - made["created_at"] == 600.0

    stored = [await redis_client.get(k) async for k in redis_client.scan_iter("*onboarding*")]
    assert len(stored) == 1
    assert isinstance(stored[0], bytes)
    assert token.encode() not in stored[0]
    assert token.split(".")[2].encode() not in stored[0]  # not even the secret part
    assert (
        0 < await redis_client.pttl(f"trellis:injector:onboarding-tokens:{made['id']}") <= 600_000
    )

    listed = (await client.get("/v1/tokens", headers=AUTH)).json()["tokens"]
    assert [t["id"] for t in listed] == [made["id"]]
    assert "digest" not in listed[0]
    assert "token" not in listed[0]
    assert token not in caplog.text
    assert (
        f"token.created token_id={made['id']} identity='shop/cart (service account cart-sa)'"
        in (caplog.text)
    )


async def test_a_token_onboards_as_many_workloads_of_its_service_as_it_says(
    client: httpx.AsyncClient,
    certificates: FakeCertificates,
    metrics: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    once = await create(client)
    first = await client.post("/v1/bootstrap", json=body(), headers=bearer(once["token"]))
    assert first.status_code == 200, first.text
    again = await client.post("/v1/bootstrap", json=body(), headers=bearer(once["token"]))
    assert again.status_code == 403
    assert again.json()["reason"] == "used-up"
    assert "allows 1 workload(s)" in again.json()["detail"]
    assert refusals(metrics, "used-up") == 1
    assert f"onboard.refused reason=used-up token_id={once['id']}" in caplog.text
    three = (await create(client, uses=3))["token"]
    answers = [
        (await client.post("/v1/bootstrap", json=body(), headers=bearer(three))).status_code
        for _ in range(4)
    ]
    assert answers == [200, 200, 200, 403]
    assert [sa for _, sa in certificates.issued] == ["cart-sa"] * 4
    assert sample(metrics, "trellis_injector_proxies_onboarded_total", caller="token") == 4


async def test_a_use_is_given_back_when_certmanager_cannot_onboard(
    client: httpx.AsyncClient, certificates: FakeCertificates
) -> None:
    token = (await create(client))["token"]
    certificates.error = Unavailable("certmanager", "down for the test")
    down = await client.post("/v1/bootstrap", json=body(), headers=bearer(token))
    assert down.status_code == 503
    certificates.error = None
    assert (
        await client.post("/v1/bootstrap", json=body(), headers=bearer(token))
    ).status_code == 200


@pytest.mark.parametrize(
    "other",
    [
        {"namespace": "billing"},  # another namespace
        {"service": "checkout"},  # another service of the namespace and account
        {"service_account": "payments"},  # another service account of the namespace
        {"service_account": ""},  # the default: the service's name, not the token's
    ],
)
async def test_a_token_used_for_another_identity_is_refused_logged_and_counted(
    client: httpx.AsyncClient,
    certificates: FakeCertificates,
    metrics: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    other: dict[str, str],
) -> None:
    made = await create(client)
    response = await client.post("/v1/bootstrap", json=body(**other), headers=bearer(made["token"]))
    assert response.status_code == 403
    answer = response.json()
    assert answer["reason"] == "wrong-identity"
    assert answer["token_id"] == made["id"]
    assert "is for shop/cart (service account cart-sa), not " in answer["detail"]
    assert certificates.issued == []
    assert refusals(metrics, "wrong-identity") == 1
    assert f"onboard.refused reason=wrong-identity token_id={made['id']}" in caplog.text
    assert made["token"] not in caplog.text


async def test_expired_revoked_and_forged_tokens_are_refused(
    client: httpx.AsyncClient,
    certificates: FakeCertificates,
    metrics: CollectorRegistry,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expiring = await create(client, ttl_seconds=60.0)
    revoked = await create(client)
    assert (await client.delete(f"/v1/tokens/{revoked['id']}", headers=AUTH)).status_code == 204
    assert (await client.delete(f"/v1/tokens/{revoked['id']}", headers=AUTH)).status_code == 404
    kept = await create(client)
    forged = kept["token"][:-4] + "AAAA"  # a known id, a wrong secret
    clock.now += 61

    cases = [
        (expiring["token"], "expired", expiring["id"]),
        (revoked["token"], "unknown-token", revoked["id"]),
        (forged, "unknown-token", kept["id"]),
        ("not-a-token", "malformed-token", "-"),
    ]
    for token, reason, token_id in cases:
        response = await client.post("/v1/bootstrap", json=body(), headers=bearer(token))
        assert response.status_code == 403, token
        assert (response.json()["reason"], response.json()["token_id"]) == (reason, token_id)
        assert f"onboard.refused reason={reason} token_id={token_id}" in caplog.text
    missing = await client.post("/v1/bootstrap", json=body())
    assert missing.status_code == 401
    assert refusals(metrics, "expired") == 1
    assert refusals(metrics, "unknown-token") == 2
    assert refusals(metrics, "malformed-token") == 1
    assert refusals(metrics, "no-token") == 1
    assert certificates.issued == []
    assert [t["id"] for t in (await client.get("/v1/tokens", headers=AUTH)).json()["tokens"]] == [
        kept["id"]
    ]  # the expired one is not listed


async def test_the_admin_token_still_onboards_any_identity(
    client: httpx.AsyncClient, metrics: CollectorRegistry
) -> None:
    response = await client.post("/v1/bootstrap", json=body(namespace="billing"), headers=AUTH)
    assert response.status_code == 200
    assert sample(metrics, "trellis_injector_proxies_onboarded_total", caller="admin") == 1


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"namespace": "trellis-system"}, "namespace"),
        ({"namespace": "Shop"}, "namespace"),
        ({"service_account": "Bad Name!"}, "service_account"),
        ({"service": "Not A Name"}, "service"),
        ({"uses": 0}, "uses"),
        ({"ttl_seconds": 10.0}, "ttl"),
        ({"ttl_seconds": 8 * 24 * 3600.0}, "ttl"),
    ],
)
async def test_bad_token_requests_are_refused_naming_the_field(
    client: httpx.AsyncClient,
    metrics: CollectorRegistry,
    caplog: pytest.LogCaptureFixture,
    fields: dict[str, Any],
    field: str,
) -> None:
    asked = {"namespace": "shop", "service": "cart", "service_account": "cart-sa", **fields}
    response = await client.post("/v1/tokens", json=asked, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["field"] == field
    assert f"token.refused field={field}" in caplog.text
    assert sample(metrics, "trellis_injector_onboarding_tokens_total", event="refused") == 1
    assert (await client.get("/v1/tokens", headers=AUTH)).json()["tokens"] == []


async def test_only_the_admin_token_manages_tokens(client: httpx.AsyncClient) -> None:
    token = (await create(client))["token"]
    asked = {"namespace": "shop", "service": "cart", "service_account": "cart-sa"}
    assert (await client.post("/v1/tokens", json=asked)).status_code == 401
    assert (await client.post("/v1/tokens", json=asked, headers=bearer(token))).status_code == 403
    assert (await client.get("/v1/tokens", headers=bearer(token))).status_code == 403
    made_id = token.split(".")[1]
    assert (await client.delete(f"/v1/tokens/{made_id}", headers=bearer(token))).status_code == 403
