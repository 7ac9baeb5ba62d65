"""Fixtures for certmanager tests: a CA, an issuer, a manager with a fake clock."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_certmanager.domain.authority import CertificateAuthority, generate_root
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_common.testing import RedisServer
from trellis_common.testing.bell import Bell
from trellis_common.testing.fixtures import component_client

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


class FakeClock:
    def __init__(self, now: dt.datetime = NOW) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, delta: dt.timedelta) -> None:
        self.now += delta


@pytest.fixture(scope="session")
def root_ca() -> CertificateAuthority:
    return generate_root(KeyAlgorithm.ECDSA_P256, dt.timedelta(days=3650), NOW, "cluster.local")


@pytest.fixture
def issuer(root_ca: CertificateAuthority) -> Issuer:
    return Issuer(root_ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy(), random.Random(7))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store() -> InMemoryCertificateStore:
    return InMemoryCertificateStore()


@pytest.fixture
def make_manager(
    store: InMemoryCertificateStore, bell: Bell, clock: FakeClock
) -> Callable[..., CertificateManager]:
    def make(**policy: object) -> CertificateManager:
        return CertificateManager(
            store,
            bell,
            IssuancePolicy(**policy),  # type: ignore[arg-type]
            KeyAlgorithm.ECDSA_P256,
            CertMetrics(CollectorRegistry()),
            clock=clock,
        )

    return make


@pytest.fixture
async def manager(make_manager: Callable[..., CertificateManager]) -> CertificateManager:
    manager = make_manager()
    await manager.start()
    return manager


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """The stores' client logs in as certmanager's own Redis user (see component_client)."""
    async with component_client(redis_server, "certmanager") as client:
        yield client
