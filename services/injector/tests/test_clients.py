"""Finding certmanager, the catalog and proxy-cp; their outages named (real Redis)."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio

from trellis_injector.clients import (
    CatalogClient,
    CertManagerClient,
    ServiceLocator,
    XdsLocator,
)
from trellis_injector.domain.onboarding import XdsEndpoint
from trellis_injector.onboarder import Unavailable
from trellis_runtime.registry import ServiceRecord, registry_key
from trellis_testing.ports import free_port


async def announce(client: redis.asyncio.Redis, kind: str, address: str) -> None:
    record = ServiceRecord.create(kind=kind, name=kind, grpc_address=address)
    await client.set(registry_key(kind, kind), record.to_json())


async def test_configured_addresses_win(redis_client: redis.asyncio.Redis) -> None:
    await announce(redis_client, "catalog", "10.0.0.1:15010")
    services = ServiceLocator(redis_client, {"catalog": "10.9.9.9:1", "certmanager": ""})
    assert await services.address("catalog") == "10.9.9.9:1"


async def test_announced_addresses(redis_client: redis.asyncio.Redis) -> None:
    await announce(redis_client, "certmanager", "127.0.0.1:15020")
    services = ServiceLocator(redis_client, {"certmanager": ""})
    assert await services.address("certmanager") == "127.0.0.1:15020"
    with pytest.raises(Unavailable) as caught:
        await services.address("catalog")
    assert caught.value.dependency == "catalog"
    assert "service registry" in caught.value.reason


async def test_the_xds_address(
    redis_client: redis.asyncio.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    services = ServiceLocator(redis_client, {})
    assert await XdsLocator(services, "xds.example", 443).xds_endpoint() == XdsEndpoint(
        "xds.example", 443
    )
    with pytest.raises(Unavailable) as caught:
        await XdsLocator(services).xds_endpoint()
    assert caught.value.dependency == "proxy-cp"

    await announce(redis_client, "proxy-cp", "127.0.0.1:15128")
    assert await XdsLocator(services).xds_endpoint() == XdsEndpoint("127.0.0.1", 15128)
    # the host proxies can reach, with the announced port
    assert await XdsLocator(services, "10.0.0.5").xds_endpoint() == XdsEndpoint("10.0.0.5", 15128)
    assert await XdsLocator(services, port=9000).xds_endpoint() == XdsEndpoint("127.0.0.1", 9000)

    await announce(redis_client, "proxy-cp", "0.0.0.0:15128")
    with caplog.at_level(logging.WARNING):
        await XdsLocator(services).xds_endpoint()
    assert "TRELLIS_INJECTOR_XDS_HOST" in caplog.text


async def test_unreachable_services_are_unavailable(redis_client: redis.asyncio.Redis) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    services = ServiceLocator(redis_client, {"certmanager": nobody, "catalog": nobody})
    with pytest.raises(Unavailable) as caught:
        await CertManagerClient(services, timeout=2).issue_proxy_certificate(
            "shop", "cart", "cart", b"a CSR"
        )
    assert caught.value.dependency == "certmanager"
    assert nobody in caught.value.reason
    with pytest.raises(Unavailable) as caught:
        await CatalogClient(services, timeout=2).expect_proxy("x.cart.shop", "cart")
    assert caught.value.dependency == "catalog"
