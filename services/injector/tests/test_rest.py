"""POST /v1/bootstrap over the real app, with the Onboarder's seams faked."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_identity import onboarding
from trellis_identity.identity import csr_for, new_key
from trellis_identity.tokens import AdminToken
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder, Refused, Unavailable
from trellis_injector.testing import FakeCatalog, FakeCertificates, FixedControlPlane
from trellis_injector.transport import rest
from trellis_runtime import admin
from trellis_testing import RedisServer
from trellis_testing.fixtures import component_client

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPIFFE = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
KEY_PEM, KEY = new_key()  # the proxy's, made on its host
CSR_PEM = csr_for(KEY, "cart proxy").decode()


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "namespace": "shop",
        "service": "cart",
        "service_account": "cart-sa",
        "app_port": 8080,
        "inbound_port": 15003,
        "outbound_port": 15001,
        "admin_port": 15000,
        "output_dir": "/srv/cart-proxy",
        "csr_pem": CSR_PEM,
    }
    base.update(overrides)
    return base


@pytest.fixture
def certificates() -> FakeCertificates:
    return FakeCertificates()


@pytest.fixture
def catalog() -> FakeCatalog:
    return FakeCatalog()


@pytest.fixture
def control_plane() -> FixedControlPlane:
    return FixedControlPlane("10.0.0.9", 15128)


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
async def injector_redis(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """The injector's own Redis user: its token store does what the ACL table allows."""
    async with component_client(redis_server, "injector") as client:
        yield client


@pytest.fixture
def tokens(injector_redis: redis.asyncio.Redis) -> onboarding.TokenStore:
    return onboarding.TokenStore(injector_redis)


@pytest.fixture
async def client(
    certificates: FakeCertificates,
    catalog: FakeCatalog,
    control_plane: FixedControlPlane,
    metrics: CollectorRegistry,
    tokens: onboarding.TokenStore,
) -> AsyncIterator[httpx.AsyncClient]:
    app = admin.create_app("injector", metrics)
    onboarder = Onboarder(certificates, catalog, control_plane, SPIFFE)
    rest.add_routes(
        app,
        onboarder,
        admin.token_guard(AdminToken.of(TOKEN)),
        AdminToken.of(TOKEN),
        tokens,
        InjectorMetrics(metrics),
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


async def test_onboarding_a_proxy(
    client: httpx.AsyncClient,
    certificates: FakeCertificates,
    catalog: FakeCatalog,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    response = await client.post("/v1/bootstrap", json=body(), headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "no-store"
    result = response.json()

    common_name = result["common_name"]
    assert common_name.endswith(".cart.shop")
    assert certificates.issued == [(common_name, "cart-sa")]
    assert catalog.expected == {common_name: "cart-sa"}
    assert result["xds_address"] == "10.0.0.9:15128"

    assert "PRIVATE KEY" not in response.text  # the proxy has its key; none travels
    assert set(result["files"]) == {"cert_chain_pem", "workload_cert_chain_pem", "trust_bundle_pem"}
    assert certificates.csrs == [CSR_PEM.encode()]  # the proxy's CSR, as it sent it
    assert "BEGIN CERTIFICATE" in result["files"]["cert_chain_pem"]
    assert "BEGIN CERTIFICATE" in result["files"]["trust_bundle_pem"]
    assert result["paths"] == {
        "cert_chain": "/srv/cart-proxy/cert.pem",
        "workload_cert": "/srv/cart-proxy/workload.pem",
        "key": "/srv/cart-proxy/key.pem",
        "trust_bundle": "/srv/cart-proxy/ca.pem",
        "sds": "/srv/cart-proxy/proxy-sds.yaml",
    }
    bootstrap = result["bootstrap"]
    assert bootstrap["node"]["id"] == common_name
    assert bootstrap["dynamic_resources"]["ads_config"]["api_type"] == "GRPC"
    (cluster,) = bootstrap["static_resources"]["clusters"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "10.0.0.9", "port_value": 15128}

    assert common_name in caplog.text  # the CN is logged ...
    assert "PRIVATE KEY" not in caplog.text  # ... the key never


async def test_defaults_service_account_and_delta(
    client: httpx.AsyncClient, catalog: FakeCatalog
) -> None:
    fields = body(protocol="delta", app_port=0)
    del fields["service_account"]
    response = await client.post("/v1/bootstrap", json=fields, headers=AUTH)
    assert response.status_code == 200, response.text
    result = response.json()
    assert catalog.expected == {result["common_name"]: "cart"}
    assert result["bootstrap"]["dynamic_resources"]["ads_config"]["api_type"] == "DELTA_GRPC"
    assert result["bootstrap"]["node"]["metadata"]["trellis"]["app_port"] == 0


async def test_the_admin_token_is_required(
    client: httpx.AsyncClient, certificates: FakeCertificates
) -> None:
    missing = await client.post("/v1/bootstrap", json=body())
    assert missing.status_code == 401
    wrong = await client.post(
        "/v1/bootstrap", json=body(), headers={"Authorization": "Bearer nope"}
    )
    assert wrong.status_code == 403
    # an invalid body without a token is refused for the token, not described
    invalid = await client.post("/v1/bootstrap", json=body(app_port="x"))
    assert invalid.status_code == 401
    assert certificates.issued == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"app_port": 65536}, "app_port"),
        ({"app_port": -1}, "app_port"),
        ({"inbound_port": 0}, "inbound_port"),
        ({"admin_port": "15000"}, "admin_port"),
        ({"protocol": "incremental"}, "protocol"),
        ({"namespace": "Shop"}, "namespace"),
        ({"service": "cart.v1"}, "service"),
        ({"service_account": "Cart"}, "service_account"),
        ({"namespace": "trellis-system"}, "namespace"),  # the control plane's own
        ({"outbound_port": 15003}, "outbound_port"),
        ({"output_dir": "cart-proxy"}, "output_dir"),
        ({"colour": "blue"}, "colour"),
        ({"csr_pem": ""}, "csr_pem"),
        ({"csr_pem": "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n"}, "csr_pem"),
        ({"csr_pem": CSR_PEM.replace("A", "B", 3)}, "csr_pem"),  # altered: does not verify
    ],
)
async def test_invalid_bodies_are_422_naming_the_field(
    client: httpx.AsyncClient,
    certificates: FakeCertificates,
    overrides: dict[str, Any],
    field: str,
) -> None:
    response = await client.post("/v1/bootstrap", json=body(**overrides), headers=AUTH)
    assert response.status_code == 422, response.text
    answer = response.json()
    assert answer["field"] == field
    assert answer["detail"].startswith(f"{field}: ")
    assert certificates.issued == []


@pytest.mark.parametrize("field", ["inbound_port", "csr_pem"])
async def test_a_missing_field_is_named(client: httpx.AsyncClient, field: str) -> None:
    fields = body()
    del fields[field]
    response = await client.post("/v1/bootstrap", json=fields, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["field"] == field


async def test_503_names_certmanager_when_it_is_down(
    client: httpx.AsyncClient, certificates: FakeCertificates, catalog: FakeCatalog
) -> None:
    certificates.error = Unavailable("certmanager", "UNAVAILABLE at 127.0.0.1:1: refused")
    response = await client.post("/v1/bootstrap", json=body(), headers=AUTH)
    assert response.status_code == 503
    assert response.json()["dependency"] == "certmanager"
    assert "certmanager" in response.json()["detail"]
    assert catalog.expected == {}


@pytest.mark.parametrize("dependency", ["catalog", "proxy-cp"])
async def test_503_names_the_catalog_or_proxy_cp(
    client: httpx.AsyncClient,
    catalog: FakeCatalog,
    control_plane: FixedControlPlane,
    certificates: FakeCertificates,
    dependency: str,
) -> None:
    outage = Unavailable(dependency, "no live instance in the service registry")
    if dependency == "catalog":
        catalog.error = outage
    else:
        control_plane.error = outage
    response = await client.post("/v1/bootstrap", json=body(), headers=AUTH)
    assert response.status_code == 503
    assert response.json()["dependency"] == dependency
    assert "PRIVATE KEY" not in response.text
    if dependency == "proxy-cp":  # looked up first: no certificate for a proxy with nowhere to go
        assert certificates.issued == []


async def test_a_refusal_is_502_or_422(
    client: httpx.AsyncClient, certificates: FakeCertificates
) -> None:
    certificates.error = Refused("certmanager", "INTERNAL at x: boom")
    response = await client.post("/v1/bootstrap", json=body(), headers=AUTH)
    assert response.status_code == 502
    assert response.json()["dependency"] == "certmanager"
    certificates.error = Refused("certmanager", "INVALID_ARGUMENT at x: no", invalid_argument=True)
    response = await client.post("/v1/bootstrap", json=body(), headers=AUTH)
    assert response.status_code == 422
    certificates.error = Refused(
        "certmanager",
        "INVALID_ARGUMENT at x: csr_pem: curve secp521r1 is not allowed: use P-256",
        invalid_argument=True,
    )
    response = await client.post("/v1/bootstrap", json=body(), headers=AUTH)
    assert response.status_code == 422
    assert response.json()["field"] == "csr_pem"
