"""The certmanager client: the ``certificates`` follower against a real certmanager.

certmanager's own manager and servicer run in the test's event loop on a real grpc.aio
server (an in-memory store). Most tests drive the follower as the signals hub does; the
rotation test runs the whole path on a real Redis: certmanager's outbox signals a
rotation, proxy-cp's hub hears it, fetches the material and rebuilds the identity's
snapshot once. (proxy-cp's own serving certificate is its component certificate, which it
joined with: nothing asks certmanager for it here.)
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2_grpc as cm_grpc
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.manager import TOPIC, Announce, CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore, proxy_key
from trellis_certmanager.transport.grpc_api import CertificateManagerServicer
from trellis_common.model import MeshService
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.certs import REJECTED_SIGNAL, CertClient
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.transport.streams import StreamRegistry
from trellis_runtime.events import Outbox, Signals
from trellis_runtime.health import Health
from trellis_runtime.signaling import Event, Publisher
from trellis_testing import RedisServer, eventually

BOOKSTORE = MeshService("bookstore", "bookstore")
IDENTITY = "bookstore/bookstore"
SERVICE_CN = "bookstore.bookstore.svc.cluster.local"


class Recorded:
    """What the client handed on: material per identity, proxies learned."""

    def __init__(self) -> None:
        self.materials: list[tuple[str, str]] = []
        self.learned: list[tuple[str, str, str]] = []
        self.learned_one = asyncio.Event()
        self.revoked: list[tuple[str, set[str]]] = []

    async def material(self, identity: str, material: SecretMaterial) -> None:
        self.materials.append((identity, material.serial))

    def proxy_issued(self, common_name: str, account: str, serial: str) -> None:
        self.learned.append((common_name, account, serial))
        self.learned_one.set()

    def proxy_revoked(self, common_name: str, serials: set[str]) -> None:
        self.revoked.append((common_name, serials))


@asynccontextmanager
async def served_certmanager(announce: Announce) -> AsyncIterator[tuple[CertificateManager, str]]:
    """certmanager's servicer on a port."""
    manager = CertificateManager(
        InMemoryCertificateStore(),
        announce,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
    )
    await manager.start()
    server = grpc.aio.server()
    cm_grpc.add_CertificateManagerServicer_to_server(CertificateManagerServicer(manager), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield manager, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def unheard(kind: str, key: str) -> int:
    return 0  # the tests below hand the follower its signals themselves


@pytest.fixture
async def certmanager() -> AsyncIterator[tuple[CertificateManager, str]]:
    async with served_certmanager(unheard) as served:
        yield served


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


@pytest.fixture
async def client(
    certmanager: tuple[CertificateManager, str], recorded: Recorded
) -> AsyncIterator[CertClient]:
    made = CertClient(
        t.locator(certmanager[1], "certmanager"),
        recorded.material,
        on_proxy_issued=recorded.proxy_issued,
        on_revoked=recorded.proxy_revoked,
    )
    try:
        yield made
    finally:
        await made.close()


def signal(kind: str, key: str) -> Event:
    return Event("certificates", kind, key, 1, "certmanager-0")


async def test_an_issued_proxy_certificate_makes_its_proxy_expected(
    certmanager: tuple[CertificateManager, str], client: CertClient, recorded: Recorded
) -> None:
    manager, _ = certmanager
    proxy = await manager.issue_proxy(
        BOOKSTORE, service_account="bookstore-v1", public_key=proxy_key()
    )

    await client.follower.changed(signal("issued", proxy.common_name))
    rotated = await manager.rotate(proxy.common_name)
    await client.follower.changed(signal("rotated", proxy.common_name))  # its new serial

    assert recorded.learned == [
        (proxy.common_name, "bookstore-v1", f"{proxy.serial:x}"),
        (proxy.common_name, "bookstore-v1", f"{rotated.serial:x}"),
    ]
    assert recorded.materials == []


async def test_certmanager_says_what_it_issued_to_a_proxy_before_any_event(
    certmanager: tuple[CertificateManager, str], client: CertClient
) -> None:
    """The onboarding question (:attr:`ExpectedProxies.ask_issuer`): asked of certmanager
    directly, with no signal delivered; a common name it never issued is None."""
    manager, _ = certmanager
    proxy = await manager.issue_proxy(
        BOOKSTORE, service_account="bookstore-v1", public_key=proxy_key()
    )

    assert await client.issued(proxy.common_name) == Expectation(
        "bookstore-v1", f"{proxy.serial:x}"
    )
    assert await client.issued(t.proxy_common_name("bookstore", "bookstore", 7)) is None


async def test_a_revoked_signal_adds_the_serials_and_ends_their_streams(
    certmanager: tuple[CertificateManager, str], client: CertClient, recorded: Recorded
) -> None:
    manager, _ = certmanager
    proxy = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    other = await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
    await manager.revoke(other.common_name)  # another proxy's: not handed on for this one
    await manager.rotate(proxy.common_name)  # revokes the old serial

    await client.follower.changed(signal("revoked", proxy.common_name))

    assert f"{proxy.serial:x}" in client.revoked
    assert f"{other.serial:x}" not in client.revoked
    assert recorded.revoked == [(proxy.common_name, {f"{proxy.serial:x}"})]
    await client.follower.resync("certificates")  # the whole set, and every name in it
    assert f"{other.serial:x}" in client.revoked
    assert sorted(name for name, _ in recorded.revoked[1:]) == sorted(
        [proxy.common_name, other.common_name]
    )


async def test_a_revoked_signal_naming_a_service_certificate_is_rejected(
    client: CertClient, recorded: Recorded
) -> None:
    await client.follower.changed(signal("revoked", SERVICE_CN))

    assert recorded.revoked == []
    [rejection] = client.health.rejections.items()
    assert (rejection.key, rejection.reason) == (SERVICE_CN, "only proxy certificates are revoked")


async def test_a_proxy_certificate_gone_before_it_was_fetched_is_skipped(
    client: CertClient, recorded: Recorded
) -> None:
    await client.follower.changed(signal("issued", t.proxy_common_name("bookstore", "bookstore")))

    assert recorded.learned == []


async def test_a_rotation_of_a_wanted_identity_is_handed_on_once(
    certmanager: tuple[CertificateManager, str], client: CertClient, recorded: Recorded
) -> None:
    manager, _ = certmanager
    first = await client.want(IDENTITY, "bookstore")
    rotated = await manager.rotate(SERVICE_CN)

    await client.follower.changed(signal("rotated", SERVICE_CN))
    await client.follower.changed(signal("rotated", SERVICE_CN))  # a duplicate: no change
    await client.follower.changed(signal("issued", SERVICE_CN))

    assert recorded.materials == [(IDENTITY, f"{rotated.serial:x}")]
    assert first.serial != f"{rotated.serial:x}"
    assert client.materials[IDENTITY].cert_chain_pem == rotated.cert_chain_pem
    assert client.materials[IDENTITY].key_pem == b""  # a service's key is not held here


async def test_a_certificate_of_an_identity_not_wanted_here_is_not_fetched(
    certmanager: tuple[CertificateManager, str], client: CertClient, recorded: Recorded
) -> None:
    manager, _ = certmanager

    await client.follower.changed(signal("issued", "reviews.bookstore.svc.cluster.local"))

    assert recorded.materials == []
    assert manager.list() == []  # had the client asked, certmanager would have issued it


@pytest.mark.parametrize(
    ("kind", "key", "reason"),
    [
        ("rotated", "not a common name", "service common name"),
        ("issued", "a.b.svc.", "service common name"),
        ("issued", "nope.bookstore.bookstore", "proxy common name"),
        ("expired", SERVICE_CN, "unknown kind 'expired'"),
    ],
)
async def test_a_signal_naming_no_certificate_is_rejected_and_skipped(
    client: CertClient, recorded: Recorded, kind: str, key: str, reason: str
) -> None:
    await client.want(IDENTITY, "bookstore")

    await client.follower.changed(signal(kind, key))

    [rejection] = client.health.rejections.items()
    assert (rejection.source, rejection.key) == (REJECTED_SIGNAL, key)
    assert reason in rejection.reason
    assert recorded.materials == []


async def test_root_changed_refetches_every_wanted_identity(
    certmanager: tuple[CertificateManager, str], client: CertClient, recorded: Recorded
) -> None:
    manager, _ = certmanager
    await client.want(IDENTITY, "bookstore")
    await client.want("bookbuyer/bookbuyer", "bookbuyer")
    await manager.rotate(SERVICE_CN)  # a signal we did not hear
    buyer = await manager.rotate("bookbuyer.bookbuyer.svc.cluster.local")

    await client.follower.changed(signal("root-changed", "root"))

    assert sorted(recorded.materials) == [
        ("bookbuyer/bookbuyer", f"{buyer.serial:x}"),
        (IDENTITY, f"{manager.get(SERVICE_CN).serial:x}"),
    ]


class CountingCache(SnapshotCache):
    """A snapshot cache that counts the snapshots set per key."""

    def __init__(self) -> None:
        super().__init__()
        self.sets: Counter[str] = Counter()
        self.versions: list[str] = []

    def set_snapshot(self, key: str, snapshot: Snapshot, *, checked: bool = False) -> None:
        super().set_snapshot(key, snapshot, checked=checked)
        self.sets[key] += 1
        self.versions.append(snapshot.version)


async def test_each_rotation_signal_rebuilds_the_identity_s_snapshot_once(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    outbox = Outbox(Publisher(redis_client, sender="certmanager-0"), Health())

    async def announce(kind: str, key: str) -> int:
        return await outbox.signal(TOPIC, kind, key)

    recorded = Recorded()
    health = Health()
    cache = CountingCache()
    async with served_certmanager(announce) as (manager, address):
        control_plane: ProxyControlPlane

        async def on_material(identity: str, material: SecretMaterial) -> None:
            await control_plane.set_material(identity, material)

        certs = CertClient(
            t.locator(address, "certmanager"), on_material, health, recorded.proxy_issued
        )
        control_plane = ProxyControlPlane(cache, t.FakeSources().fetch_inputs, certs.want)
        proxy = t.proxy_common_name("bookstore", "bookstore")
        stream = await t.connect(control_plane, StreamRegistry(), proxy)
        signals = Signals(redis_server.url, health)
        signals.follow(certs.follower)
        stop = asyncio.Event()
        hub = asyncio.create_task(signals.run(stop))
        try:
            await asyncio.wait_for(certs.connected.wait(), 10)
            assert cache.sets[stream.key] == 1  # built when the proxy connected
            serials = []
            for _ in range(2):
                rotated = await manager.rotate(SERVICE_CN)
                serials.append(f"{rotated.serial:x}")
                await eventually(lambda: control_plane.materials[IDENTITY].serial == serials[-1])
            # A barrier: certmanager's next signal is handled after every earlier one.
            await manager.issue_proxy(BOOKSTORE, public_key=proxy_key())
            await asyncio.wait_for(recorded.learned_one.wait(), 10)
        finally:
            stop.set()
            await hub
            await certs.close()

    assert cache.sets[stream.key] == 3  # one at connect, then one per rotation
    assert [v.rsplit("/", 1)[1] for v in cache.versions[1:]] == serials  # "<inputs>/<serial>"
