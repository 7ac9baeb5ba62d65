"""The catalog's followers on the one event path: a real Redis rings, real gRPC peers answer.

The peers are grpc.aio servers in this process that answer what an older or broken service
could (records no current validation would let in), which is the point: the consumer
validates again. A bad record is rejected with its reason and skipped; the rest flows.
Signals are published with the real :class:`~trellis_runtime.signaling.Publisher` and the
registry is written by a real :class:`~trellis_runtime.registry.Announcer`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import redis.asyncio

from trellis_api import certmanager_pb2 as cpb
from trellis_api import certmanager_pb2_grpc as cpb_grpc
from trellis_api import endpoints_pb2 as epb
from trellis_api import endpoints_pb2_grpc as epb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.clients.certs import CertificateFollower
from trellis_catalog.clients.providers import KIND, ProviderFollower
from trellis_catalog.domain.model.views import Identity
from trellis_common.changefeed import ChangeFeed
from trellis_common.model import MeshService
from trellis_runtime.events import Follower, Signals
from trellis_runtime.grpcserver import GrpcServer
from trellis_runtime.health import Health
from trellis_runtime.locate import Locator
from trellis_runtime.registry import Announcer, ServiceRecord, registry_key
from trellis_runtime.signaling import Publisher
from trellis_testing import RedisServer, eventually

GOOD_PROXY = "0b4c9a4e-7d7e-4c1b-9d7a-1a2b3c4d5e6f.bookbuyer.bookbuyer"
BAD_PROXY = "1b4c9a4e-7d7e-4c1b-9d7a-1a2b3c4d5e6f.bookthief.bookthief"
NEW_PROXY = "2b4c9a4e-7d7e-4c1b-9d7a-1a2b3c4d5e6f.bookstore.bookstore"
BUYER_CERT = "bookbuyer.bookbuyer.svc.cluster.local"


class FakeProvider(epb_grpc.EndpointsProviderServicer):
    """An endpoints provider: answers from ``services`` (a watch hears each :meth:`set`
    and :meth:`remove`, as a provider's watch does), counts the calls."""

    def __init__(self) -> None:
        self.services: dict[tuple[str, str], epb.ServiceEndpoints] = {}
        self.calls: Counter[str] = Counter()
        self.feed: ChangeFeed[tuple[str, str]] = ChangeFeed()
        self.refusing = False
        self._broken = asyncio.Event()

    def set(self, *services: epb.ServiceEndpoints) -> None:
        for message in services:
            ref = message.info.service
            self.services[(ref.namespace, ref.name)] = message
            self.feed.changed([(ref.namespace, ref.name)])

    def remove(self, namespace: str, name: str) -> None:
        del self.services[(namespace, name)]
        self.feed.changed([(namespace, name)])

    def break_watches(self) -> None:
        """End every watch UNAVAILABLE, and refuse new ones while ``refusing``."""
        self.refusing = True
        broken, self._broken = self._broken, asyncio.Event()
        broken.set()

    async def WatchServices(
        self, request: epb.ListServicesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[epb.ServiceChanges]:
        self.calls["WatchServices"] += 1
        if self.refusing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "provider restarting")
        broken = self._broken
        with self.feed.watch() as watch:
            yield epb.ServiceChanges(full=True, services=list(self.services.values()))
            while True:
                answer = epb.ServiceChanges()
                taken = asyncio.ensure_future(watch.next())
                await asyncio.wait(
                    {taken, asyncio.ensure_future(broken.wait())}, return_when="FIRST_COMPLETED"
                )
                if broken.is_set():
                    taken.cancel()
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "provider restarting")
                for key in taken.result():
                    found = self.services.get(key)
                    if found is None:
                        answer.removed.add(namespace=key[0], name=key[1])
                    else:
                        answer.services.append(found)
                yield answer

    async def ListServices(
        self, request: epb.ListServicesRequest, context: object
    ) -> epb.ListServicesResponse:
        self.calls["ListServices"] += 1
        return epb.ListServicesResponse(services=list(self.services.values()))

    async def GetService(
        self, request: epb.GetServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> epb.ServiceEndpoints:
        self.calls[f"GetService {request.service.namespace}/{request.service.name}"] += 1
        found = self.services.get((request.service.namespace, request.service.name))
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such service")
        return found


class FakeCertmanager(cpb_grpc.CertificateManagerServicer):
    def __init__(self, *records: cpb.CertificateInfo) -> None:
        self.records = {r.common_name: r for r in records}
        self.fingerprint = "ab"
        self.calls: Counter[str] = Counter()

    async def ListRevokedComponentCertificates(
        self, request: cpb.ListRevokedComponentCertificatesRequest, context: object
    ) -> cpb.ListRevokedComponentCertificatesResponse:
        return cpb.ListRevokedComponentCertificatesResponse()  # none revoked

    async def GetRoot(self, request: cpb.GetRootRequest, context: object) -> cpb.RootBundle:
        self.calls["GetRoot"] += 1
        return cpb.RootBundle(fingerprint_sha256=self.fingerprint)

    async def ListCertificates(
        self, request: cpb.ListCertificatesRequest, context: object
    ) -> cpb.ListCertificatesResponse:
        return cpb.ListCertificatesResponse(
            certificates=[r for r in self.records.values() if r.kind == request.kind]
        )

    async def GetCertificateInfo(
        self, request: cpb.GetCertificateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> cpb.CertificateInfo:
        self.calls[f"GetCertificateInfo {request.common_name}"] += 1
        found = self.records.get(request.common_name)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such certificate")
        return found

    async def _unused(self, request: object, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by the catalog's follower")

    IssueCertificate = GetCertificate = RotateCertificate = ListRevokedCertificates = _unused
    RenewComponentCertificate = RenewProxyCertificate = EnrollProxy = _unused


@contextlib.asynccontextmanager
async def serving(add: Callable[[grpc.aio.Server], None]) -> AsyncIterator[str]:
    server = GrpcServer("127.0.0.1:0", [add], [], grace=0.1)
    stop = asyncio.Event()
    await server.start()
    task = asyncio.create_task(server.run(stop))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def running(component: Callable[[asyncio.Event], Any]) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(component(stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def following(url: str, health: Health, *followers: Follower) -> AsyncIterator[None]:
    """A service's signals hub with ``followers``; entered once every one has resynced."""
    hub = Signals(url, health)
    for follower in followers:
        hub.follow(follower)
    async with running(hub.run):
        for follower in followers:
            await asyncio.wait_for(follower.synced.wait(), 10)
        yield


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
async def provider_address(provider: FakeProvider) -> AsyncIterator[str]:
    async with serving(
        lambda s: epb_grpc.add_EndpointsProviderServicer_to_server(provider, s)
    ) as address:
        yield address


def service(
    namespace: str,
    name: str,
    *endpoints: epb.Endpoint,
    source: str = "",
    hosts: tuple[str, ...] = (),
) -> epb.ServiceEndpoints:
    return epb.ServiceEndpoints(
        info=epb.ServiceInfo(
            service=epb.ServiceRef(namespace=namespace, name=name),
            ports=[epb.ServicePort(name="http", number=80, protocol="HTTP")],
            hosts=hosts,
            source=source,
            location=epb.MESH_EXTERNAL if hosts else epb.MESH_INTERNAL,
            resolution=epb.DNS if hosts else epb.STATIC,
        ),
        endpoints=list(endpoints),
    )


def endpoint(address: str, account: str = "bookstore") -> epb.Endpoint:
    return epb.Endpoint(address=address, ports={"http": 8080}, service_account=account)


def flushed(catalog: Catalog) -> set[MeshService]:
    catalog.flush()
    return set(catalog.services)


def addresses(catalog: Catalog, namespace: str, name: str) -> list[str]:
    catalog.flush()
    known = catalog.services.get(MeshService(namespace, name))
    return [e.address for e in known.endpoints] if known else []


async def register(client: redis.asyncio.Redis, name: str, address: str) -> ServiceRecord:
    """What a provider's announcer writes, without its ``up`` signal."""
    record = ServiceRecord.create(kind=KIND, name=name, grpc_address=address)
    await client.set(registry_key(KIND, name), record.to_json())
    return record


@pytest.fixture
async def providers(
    redis_client: redis.asyncio.Redis, provider_address: str
) -> tuple[Catalog, Health, ProviderFollower]:
    """The catalog's provider follower; provider ``vm`` (the ``provider`` fixture) is live."""
    await register(redis_client, "vm", provider_address)
    health = Health()
    catalog = Catalog(health=health)
    return catalog, health, ProviderFollower(catalog, redis_client, health, grace=30)


async def test_a_change_is_pushed_on_the_watch_with_no_signal_and_no_fetch(
    redis_server: RedisServer,
    provider: FakeProvider,
    providers: tuple[Catalog, Health, ProviderFollower],
) -> None:
    catalog, health, follower = providers
    provider.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
    async with following(redis_server.url, health, follower):
        assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]

        provider.set(service("shop", "orders", endpoint("10.0.0.9", "orders")))
        await eventually(lambda: addresses(catalog, "shop", "orders") == ["10.0.0.9"])

        provider.remove("shop", "orders")
        await eventually(lambda: MeshService("shop", "orders") not in flushed(catalog))

    assert provider.calls == {"WatchServices": 1}  # one watch, nothing listed or fetched
    assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]
    assert health.rejections.items() == []


async def test_a_broken_watch_is_down_keeps_the_endpoints_and_lists_again(
    redis_server: RedisServer,
    provider: FakeProvider,
    providers: tuple[Catalog, Health, ProviderFollower],
) -> None:
    """The provider's stream fails (a restart): its loop is down with the reason, its
    endpoints stay, and the next watch lists in full, the change made meanwhile with it."""
    catalog, health, follower = providers
    provider.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
    async with following(redis_server.url, health, follower):
        provider.break_watches()
        await eventually(lambda: "provider vm" in health.loops.down())
        assert "UNAVAILABLE: provider restarting" in health.loops.down()["provider vm"]
        provider.set(service("shop", "cart", endpoint("10.0.0.8", "cart")))  # meanwhile
        assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]  # kept while down

        provider.refusing = False  # it is back: the next watch lists in full
        await eventually(lambda: addresses(catalog, "shop", "cart") == ["10.0.0.8"])
        await eventually(lambda: "provider vm" not in health.loops.down())


async def test_a_service_entry_host_reaches_the_catalog_under_its_entry(
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    provider: FakeProvider,
    providers: tuple[Catalog, Health, ProviderFollower],
) -> None:
    """The README's ServiceEntry: endpoints-vm keys it by host, which is not a DNS label."""
    catalog, health, follower = providers
    host = "payments.example.com"
    provider.set(
        service(
            "shop",
            host,
            epb.Endpoint(address=host, ports={"https": 443}),
            source="ServiceEntry shop/payments",
            hosts=(host,),
        )
    )
    async with following(redis_server.url, health, follower):
        catalog.flush()
        assert catalog.services[MeshService("shop", "payments")].hosts == (host,)
        # a change of the host (its key) is fetched and lands under the entry again
        provider.set(
            service(
                "shop",
                host,
                epb.Endpoint(address="10.1.0.1", ports={"https": 443}),
                source="ServiceEntry shop/payments",
                hosts=(host,),
            )
        )
        await eventually(lambda: addresses(catalog, "shop", "payments") == ["10.1.0.1"])
    assert health.rejections.items() == []


async def test_bad_records_are_rejected_one_by_one_and_the_rest_flows(
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    provider: FakeProvider,
    providers: tuple[Catalog, Health, ProviderFollower],
) -> None:
    catalog, health, follower = providers
    provider.set(
        service("shop", "cart", endpoint("10.0.0.7", "cart"), endpoint("10.0.0.8", "Bad Name!")),
        service("Bad_NS", "cart"),
        service("shop", "orders", endpoint("10.0.0.9", "orders")),
    )
    async with following(redis_server.url, health, follower):
        rejected = {(r.key, r.reason) for r in health.rejections.items()}
        assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]
        assert MeshService("shop", "orders") in catalog.services
        assert {key for key, _ in rejected} == {"shop/cart", "Bad_NS/cart"}
        assert any(
            "endpoint.service_account" in reason and "Bad Name!" in reason for _, reason in rejected
        )
        assert any("namespace" in reason for key, reason in rejected if key == "Bad_NS/cart")

        # a later good version of the service clears its rejection
        provider.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
        await eventually(lambda: {r.key for r in health.rejections.items()} == {"Bad_NS/cart"})

        # a bad version fetched on a signal is rejected, and the last good one is no truth
        bad = service("shop", "orders", endpoint("10.0.0.9", "orders"))
        bad.info.ports[0].number = 70000
        provider.set(bad)
        await eventually(lambda: MeshService("shop", "orders") not in flushed(catalog))
        assert health.loops.down() == {}

    orders = next(r for r in health.rejections.items() if r.key == "shop/orders")
    assert "port 'http' is 70000" in orders.reason
    assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]


async def test_a_new_provider_is_listed_when_it_announces_itself(
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    provider: FakeProvider,
    providers: tuple[Catalog, Health, ProviderFollower],
) -> None:
    """No configuration: a new provider pod's registry ``up`` is enough."""
    catalog, health, follower = providers
    provider.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
    second = FakeProvider()
    second.set(service("shop", "cart", endpoint("10.0.0.8", "cart")))
    async with (
        following(redis_server.url, health, follower),
        serving(lambda s: epb_grpc.add_EndpointsProviderServicer_to_server(second, s)) as address,
    ):
        assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]
        record = ServiceRecord.create(kind=KIND, name="vm-2", grpc_address=address)
        async with running(Announcer(redis_client, record, ttl=30).run):
            await eventually(lambda: addresses(catalog, "shop", "cart") == ["10.0.0.7", "10.0.0.8"])
            assert set(follower.providers) == {"vm", "vm-2"}
            assert health.loops.down() == {}
        # it stopped cleanly (``down``): its endpoints stay for the grace period
        await eventually(lambda: follower.providers["vm-2"].missing_since is not None)
        assert "provider vm-2" in health.loops.down()
    assert second.calls["WatchServices"] == 1
    assert addresses(catalog, "shop", "cart") == ["10.0.0.7", "10.0.0.8"]


async def test_a_provider_missing_from_the_registry_keeps_its_endpoints_for_the_grace(
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    provider: FakeProvider,
    provider_address: str,
) -> None:
    provider.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
    record = await register(redis_client, "vm", provider_address)
    now = [1000.0]
    health = Health()
    catalog = Catalog(health=health)
    follower = ProviderFollower(catalog, redis_client, health, grace=30, clock=lambda: now[0])
    async with following(redis_server.url, health, follower):
        assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]

        # it crashed: no ``down`` rings, its registry key just expires
        await redis_client.delete(registry_key(KIND, "vm"))
        await follower.sweep()
        now[0] += 29
        await follower.sweep()
        assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]
        assert "provider vm" in health.loops.down()

        # back within the grace (a new pod, the same name): listed again, nothing lost
        async with running(Announcer(redis_client, record, ttl=30).run):
            await eventually(lambda: follower.providers["vm"].missing_since is None)
            assert "provider vm" not in health.loops.down()
            assert provider.calls["WatchServices"] == 1  # it never broke: watched on
        # stopped cleanly this time: ``down`` starts the grace at once
        await eventually(lambda: follower.providers["vm"].missing_since == now[0])
        now[0] += 31  # gone for longer than the grace: its services go
        await follower.sweep()
        assert MeshService("shop", "cart") not in flushed(catalog)
        assert follower.providers == {}
        assert "provider vm" not in {loop.name for loop in health.loops}


async def test_certificate_signals_fetch_the_record_they_name(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    """Proxy certificates make proxies expected; an older certmanager's bad record (account
    'Bad Name!') is rejected, not fatal; a service certificate reaches its view."""
    certmanager = FakeCertmanager(
        cpb.CertificateInfo(
            common_name=GOOD_PROXY, kind=cpb.CERTIFICATE_KIND_PROXY, service_account="bookbuyer"
        ),
        cpb.CertificateInfo(
            common_name=BAD_PROXY, kind=cpb.CERTIFICATE_KIND_PROXY, service_account="Bad Name!"
        ),
    )
    health = Health()
    catalog = Catalog(health=health)
    bell = Publisher(redis_client, sender="certmanager")
    async with serving(
        lambda s: cpb_grpc.add_CertificateManagerServicer_to_server(certmanager, s)
    ) as address:
        locator = Locator(redis_client, "certmanager", address)
        follower = CertificateFollower(catalog, locator, health.rejections)
        async with following(redis_server.url, health, follower):
            assert catalog.flush() is not None  # the crash-loop of the live failure raised here
            assert set(catalog.proxies) == {GOOD_PROXY}
            [rejection] = health.rejections.items()
            assert rejection.key == f"proxy {BAD_PROXY}"
            assert "service account 'Bad Name!'" in rejection.reason

            await bell.publish("certificates", "issued", "gone.gone.svc.cluster.local")
            certmanager.records[NEW_PROXY] = cpb.CertificateInfo(
                common_name=NEW_PROXY, kind=cpb.CERTIFICATE_KIND_PROXY, service_account="bookstore"
            )
            await bell.publish("certificates", "issued", NEW_PROXY)
            await eventually(lambda: NEW_PROXY in catalog.proxies)

            certmanager.records[BUYER_CERT] = cpb.CertificateInfo(
                common_name=BUYER_CERT,
                kind=cpb.CERTIFICATE_KIND_SERVICE,
                serial="0f",
                service=cpb.MeshService(namespace="bookbuyer", name="bookbuyer"),
            )
            await bell.publish("certificates", "rotated", BUYER_CERT)
            await eventually(lambda: Identity("bookbuyer", "bookbuyer") in catalog.certificates)
            ref = catalog.certificates[Identity("bookbuyer", "bookbuyer")]
            assert (ref.serial, ref.trust_bundle_fingerprint) == ("0f", "ab")

            certmanager.fingerprint = "cd"
            await bell.publish("certificates", "root-changed", "root")
            await eventually(lambda: follower.fingerprint == "cd")
            assert certmanager.calls["GetRoot"] == 2
            assert health.loops.down() == {}
        await locator.close()
    # a record pruned since its signal (NOT_FOUND) was skipped without a fuss
    assert certmanager.calls["GetCertificateInfo gone.gone.svc.cluster.local"] == 1
    assert [r.key for r in health.rejections.items()] == [f"proxy {BAD_PROXY}"]


def test_proxies_that_are_gone_are_pruned() -> None:
    now = [1000.0]
    catalog = Catalog(clock=lambda: now[0])
    catalog.expect_proxy(GOOD_PROXY, "bookbuyer", not_after=2000.0)
    catalog.expect_proxy(BAD_PROXY.replace("bookthief", "bookstore"), "bookstore")
    catalog.register_proxy(GOOD_PROXY)

    # certmanager no longer lists the second proxy (its record expired and was pruned)
    catalog.expect_only([GOOD_PROXY])
    assert set(catalog.proxies) == {GOOD_PROXY}

    # the first disconnects; its certificate expires later: then it is forgotten too
    catalog.unregister_proxy(GOOD_PROXY)
    assert catalog.prune_proxies() == 0
    now[0] = 2001.0
    assert catalog.prune_proxies() == 1
    assert catalog.proxies == {}
    catalog.flush()
    assert catalog.identities() == []


async def test_replicas_of_a_provider_are_one_provider_and_a_failover_costs_no_grace(
    redis_server: RedisServer,
    redis_client: redis.asyncio.Redis,
    provider: FakeProvider,
    provider_address: str,
) -> None:
    """``endpoints-vm`` and ``endpoints-vm-2`` report the same services: followed as one
    provider, their endpoints are not doubled, and the first one's death moves the catalog
    to the other at once, with every endpoint kept and no grace period started."""
    provider.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
    standby = FakeProvider()
    standby.set(service("shop", "cart", endpoint("10.0.0.7", "cart")))
    now = [1000.0]
    health = Health()
    catalog = Catalog(health=health)
    follower = ProviderFollower(catalog, redis_client, health, grace=30, clock=lambda: now[0])
    first = ServiceRecord.create(
        kind=KIND, name="endpoints-vm", grpc_address=provider_address, started_at=1.0
    )
    await redis_client.set(registry_key(KIND, first.name), first.to_json())
    async with serving(
        lambda s: epb_grpc.add_EndpointsProviderServicer_to_server(standby, s)
    ) as address:
        second = ServiceRecord.create(
            kind=KIND, name="endpoints-vm-2", grpc_address=address, started_at=2.0
        )
        await redis_client.set(registry_key(KIND, second.name), second.to_json())
        async with following(redis_server.url, health, follower):
            assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]  # not twice
            assert set(follower.providers) == {"endpoints-vm"}
            assert catalog.providers() == {"endpoints-vm"}
            assert standby.calls["WatchServices"] == 0  # followed through the senior one

            # a change (a replica made it, or the one followed) comes through the one followed
            provider.set(service("shop", "orders", endpoint("10.0.0.9", "orders")))
            await eventually(lambda: addresses(catalog, "shop", "orders") == ["10.0.0.9"])

            # the first replica dies (its key expires, no ``down``): the other takes over
            standby.set(service("shop", "orders", endpoint("10.0.0.9", "orders")))
            await redis_client.delete(registry_key(KIND, first.name))
            await follower.sweep()
            await follower.resync("registry")
            assert follower.providers["endpoints-vm"].record.name == "endpoints-vm-2"
            assert follower.providers["endpoints-vm"].missing_since is None
            assert "provider endpoints-vm" not in health.loops.down()
            assert standby.calls["WatchServices"] == 1  # the replica followed next, in full
            assert addresses(catalog, "shop", "cart") == ["10.0.0.7"]
            assert addresses(catalog, "shop", "orders") == ["10.0.0.9"]
