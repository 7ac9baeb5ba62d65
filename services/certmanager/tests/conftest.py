"""Fixtures for certmanager tests: a CA, an issuer, a manager with a fake clock, and two
replicas on one real Redis (``pair``), each with its own metrics (``issued``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
import weakref
from collections.abc import AsyncIterator, Callable

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_certmanager.domain.authority import CertificateAuthority, generate_root
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.domain.sealed import Kek, Sealer
from trellis_certmanager.manager import TOPIC, CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.store import RedisCertificateStore
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_runtime.signaling import Publisher
from trellis_testing import RedisServer
from trellis_testing.bell import Bell
from trellis_testing.fixtures import component_client

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
SEALER = Sealer(Kek.generate())


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


#: each replica's metrics registry, by the replica (``issued``)
REGISTRIES: weakref.WeakKeyDictionary[CertificateManager, CollectorRegistry] = (
    weakref.WeakKeyDictionary()
)


def issued(manager: CertificateManager, kind: str) -> float:
    """The certificates of ``kind`` this replica's metrics say it issued."""
    sample = "trellis_certmanager_certificates_issued_total"
    return REGISTRIES[manager].get_sample_value(sample, {"kind": kind}) or 0.0


@pytest.fixture
async def clients(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[redis.asyncio.Redis, redis.asyncio.Redis]]:
    """One client per replica, each logged in as certmanager's own Redis user."""
    async with (
        component_client(redis_server, "certmanager") as a,
        component_client(redis_server, "certmanager") as b,
    ):
        yield a, b


@pytest.fixture
def make_replica(clock: FakeClock) -> Callable[..., CertificateManager]:
    """A replica on ``client``: its own store, metrics and memory; signals published for
    real (``sender``) so that the other replica's follower sees them."""

    def replica(client: redis.asyncio.Redis, sender: str = "certmanager-0") -> CertificateManager:
        publisher = Publisher(client, sender=sender)

        async def announce(kind: str, key: str) -> int:
            return (await publisher.publish(TOPIC, kind, key)).revision

        registry = CollectorRegistry()
        manager = CertificateManager(
            RedisCertificateStore(client, SEALER),
            announce,
            IssuancePolicy(),
            KeyAlgorithm.ECDSA_P256,
            CertMetrics(registry),
            clock=clock,
        )
        REGISTRIES[manager] = registry
        return manager

    return replica


@pytest.fixture
async def pair(
    clients: tuple[redis.asyncio.Redis, redis.asyncio.Redis],
    make_replica: Callable[..., CertificateManager],
) -> tuple[CertificateManager, CertificateManager]:
    """Two replicas started on one Redis: one CA between them, as SET NX makes sure."""
    a = make_replica(clients[0], "certmanager-a")
    b = make_replica(clients[1], "certmanager-b")
    ca_a, ca_b = await asyncio.gather(a.start(), b.start())
    assert ca_a.fingerprint == ca_b.fingerprint
    return a, b
