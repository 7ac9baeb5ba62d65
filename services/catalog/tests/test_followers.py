"""The catalog's followers isolate bad records: a provider's or certmanager's record that
fails validation is rejected with its reason and skipped, and everything else flows.

The peers are real grpc.aio servers in this process that send what an older or broken
service could send (records no current validation would let in), which is the point:
the consumer validates again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from trellis_api import certmanager_pb2 as cpb
from trellis_api import certmanager_pb2_grpc as cpb_grpc
from trellis_api import endpoints_pb2 as epb
from trellis_api import endpoints_pb2_grpc as epb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.clients.certs import CertificateFollower
from trellis_catalog.clients.providers import ProviderFollower, ProviderSet
from trellis_common.grpcserver import GrpcServer
from trellis_common.health import Health
from trellis_common.model import MeshService
from trellis_common.registry import ServiceRecord, registry_key
from trellis_common.testing import eventually

GOOD_PROXY = "0b4c9a4e-7d7e-4c1b-9d7a-1a2b3c4d5e6f.bookbuyer.bookbuyer"
BAD_PROXY = "1b4c9a4e-7d7e-4c1b-9d7a-1a2b3c4d5e6f.bookthief.bookthief"


async def _announce(kind: str, key: str) -> int:
    return 0


class FakeProvider(epb_grpc.EndpointsProviderServicer):
    """An endpoints provider that lists ``services`` and then streams ``events``."""

    def __init__(self) -> None:
        self.services: list[epb.ServiceEndpoints] = []
        self.events: asyncio.Queue[epb.EndpointsEvent] = asyncio.Queue()
        self.revision = 1

    async def ListServices(
        self, request: epb.ListServicesRequest, context: object
    ) -> epb.ListServicesResponse:
        return epb.ListServicesResponse(services=self.services, revision=self.revision)

    async def Watch(
        self, request: epb.WatchRequest, context: object
    ) -> AsyncIterator[epb.EndpointsEvent]:
        yield epb.EndpointsEvent(kind=epb.EndpointsEvent.SNAPSHOT, revision=self.revision)
        while True:
            yield await self.events.get()

    async def GetService(
        self, request: epb.GetServiceRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> epb.ServiceEndpoints:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by the catalog")


class FakeCertmanager(cpb_grpc.CertificateManagerServicer):
    def __init__(self, proxies: list[cpb.CertificateInfo]) -> None:
        self.proxies = proxies

    async def GetRoot(self, request: cpb.GetRootRequest, context: object) -> cpb.RootBundle:
        return cpb.RootBundle(fingerprint_sha256="ab")

    async def ListCertificates(
        self, request: cpb.ListCertificatesRequest, context: object
    ) -> cpb.ListCertificatesResponse:
        return cpb.ListCertificatesResponse(certificates=self.proxies)

    async def WatchCertificates(
        self, request: cpb.WatchCertificatesRequest, context: object
    ) -> AsyncIterator[cpb.CertificateEvent]:
        yield cpb.CertificateEvent(kind=cpb.CertificateEvent.SNAPSHOT)
        await asyncio.Event().wait()

    async def _unused(self, request: object, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not used by the catalog")

    IssueCertificate = GetCertificate = RotateCertificate = _unused


async def _serve(add: Callable[[grpc.aio.Server], None]) -> AsyncIterator[str]:
    server = GrpcServer("127.0.0.1:0", [add], [], grace=0.1)
    stop = asyncio.Event()
    await server.start()
    task = asyncio.create_task(server.run(stop))
    try:
        yield f"127.0.0.1:{server.port}"
    finally:
        stop.set()
        await task


@pytest.fixture
def provider() -> FakeProvider:
    return FakeProvider()


@pytest.fixture
async def provider_address(provider: FakeProvider) -> AsyncIterator[str]:
    async for address in _serve(
        lambda s: epb_grpc.add_EndpointsProviderServicer_to_server(provider, s)
    ):
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


async def following(
    catalog: Catalog, address: str, health: Health
) -> AsyncIterator[ProviderFollower]:
    record = ServiceRecord.create(
        kind="endpoints-provider", name="vm", grpc_address=address, admin_address="", attributes={}
    )
    follower = ProviderFollower(catalog, record, health)
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    try:
        yield follower
    finally:
        stop.set()
        await task


async def test_a_service_entry_host_reaches_the_catalog_under_its_entry(
    provider: FakeProvider, provider_address: str
) -> None:
    """The README's ServiceEntry: endpoints-vm keys it by host, which is not a DNS label."""
    provider.services = [
        service(
            "shop",
            "payments.example.com",
            epb.Endpoint(address="payments.example.com", ports={"https": 443}),
            source="ServiceEntry shop/payments",
            hosts=("payments.example.com",),
        )
    ]
    health = Health()
    catalog = Catalog(_announce, health=health)
    async for follower in following(catalog, provider_address, health):
        await asyncio.wait_for(follower.synced.wait(), 10)
        # a VM registered afterwards still flows
        provider.events.put_nowait(
            epb.EndpointsEvent(
                kind=epb.EndpointsEvent.CHANGED,
                revision=2,
                service=epb.ServiceRef(namespace="shop", name="cart"),
                state=service("shop", "cart", endpoint("10.0.0.7", "cart")),
            )
        )
        await eventually(lambda: MeshService("shop", "cart") in flushed(catalog))

    known = catalog.services[MeshService("shop", "payments")]
    assert known.hosts == ("payments.example.com",)
    assert [e.address for e in catalog.services[MeshService("shop", "cart")].endpoints] == [
        "10.0.0.7"
    ]
    assert health.rejections.items() == []


async def test_bad_records_are_rejected_one_by_one_and_the_rest_flows(
    provider: FakeProvider, provider_address: str
) -> None:
    provider.services = [
        service("shop", "cart", endpoint("10.0.0.7", "cart"), endpoint("10.0.0.8", "Bad Name!")),
        service("Bad_NS", "cart"),
        service("shop", "orders", endpoint("10.0.0.9", "orders")),
    ]
    health = Health()
    catalog = Catalog(_announce, health=health)
    async for follower in following(catalog, provider_address, health):
        await asyncio.wait_for(follower.synced.wait(), 10)
        catalog.flush()
        rejected = {(r.key, r.reason) for r in health.rejections.items()}
        assert [e.address for e in catalog.services[MeshService("shop", "cart")].endpoints] == [
            "10.0.0.7"
        ]
        assert MeshService("shop", "orders") in catalog.services
        assert {key for key, _ in rejected} == {"shop/cart", "Bad_NS/cart"}
        assert any(
            "endpoint.service_account" in reason and "Bad Name!" in reason for _, reason in rejected
        )
        assert any("namespace" in reason for key, reason in rejected if key == "Bad_NS/cart")
        # a later good version of the service clears its rejection
        provider.events.put_nowait(
            epb.EndpointsEvent(
                kind=epb.EndpointsEvent.CHANGED,
                revision=2,
                service=epb.ServiceRef(namespace="shop", name="cart"),
                state=service("shop", "cart", endpoint("10.0.0.7", "cart")),
            )
        )
        await eventually(lambda: {r.key for r in health.rejections.items()} == {"Bad_NS/cart"})
        assert health.loops.down() == {}


async def test_a_revision_that_goes_backwards_forces_a_resync(
    provider: FakeProvider, provider_address: str
) -> None:
    """The lost-update guard: events after a counter reset are not skipped as 'listed'."""
    provider.revision = 100
    health = Health()
    catalog = Catalog(_announce, health=health)
    async for follower in following(catalog, provider_address, health):
        await asyncio.wait_for(follower.synced.wait(), 10)
        provider.revision = 1  # Redis lost the counter; the provider starts over
        provider.services = [service("shop", "cart", endpoint("10.0.0.7", "cart"))]
        provider.events.put_nowait(
            epb.EndpointsEvent(
                kind=epb.EndpointsEvent.CHANGED,
                revision=1,
                service=epb.ServiceRef(namespace="shop", name="cart"),
                state=provider.services[0],
            )
        )
        await eventually(lambda: MeshService("shop", "cart") in flushed(catalog))
    assert catalog.services[MeshService("shop", "cart")].endpoints


async def test_a_proxy_record_with_a_bad_account_is_rejected_not_fatal() -> None:
    """An older certmanager stored a PROXY record for account 'Bad Name!'."""
    certmanager = FakeCertmanager(
        [
            cpb.CertificateInfo(
                common_name=GOOD_PROXY, kind=cpb.CERTIFICATE_KIND_PROXY, service_account="bookbuyer"
            ),
            cpb.CertificateInfo(
                common_name=BAD_PROXY, kind=cpb.CERTIFICATE_KIND_PROXY, service_account="Bad Name!"
            ),
        ]
    )
    health = Health()
    catalog = Catalog(_announce, health=health)
    async for address in _serve(
        lambda s: cpb_grpc.add_CertificateManagerServicer_to_server(certmanager, s)
    ):
        follower = CertificateFollower(catalog, address, health)
        stop = asyncio.Event()
        task = asyncio.create_task(follower.run(stop))
        await asyncio.wait_for(follower.synced.wait(), 10)
        stop.set()
        await task

    batch = catalog.flush()  # the crash-loop of the live failure: flush() raised here
    assert batch is not None
    assert set(catalog.proxies) == {GOOD_PROXY}
    [rejection] = health.rejections.items()
    assert rejection.key == f"proxy {BAD_PROXY}"
    assert "service account 'Bad Name!'" in rejection.reason


async def test_a_provider_missing_from_the_registry_keeps_its_endpoints_for_the_grace(
    provider: FakeProvider, provider_address: str, redis_client: Any
) -> None:
    provider.services = [service("shop", "cart", endpoint("10.0.0.7", "cart"))]
    record = ServiceRecord.create(
        kind="endpoints-provider", name="vm", grpc_address=provider_address
    )
    key = registry_key(record.kind, record.name)
    await redis_client.set(key, record.to_json())
    now = [1000.0]
    health = Health()
    catalog = Catalog(_announce, health=health)
    providers = ProviderSet(catalog, redis_client, health, grace=30, clock=lambda: now[0])
    try:
        await providers.refresh()
        await eventually(lambda: MeshService("shop", "cart") in flushed(catalog))

        await redis_client.delete(key)  # a missed heartbeat, a Redis restart, a new pod
        now[0] += 29
        await providers.refresh()
        assert MeshService("shop", "cart") in flushed(catalog)
        assert "vm" in providers.followers

        await redis_client.set(key, record.to_json())  # back in time: nothing happened
        now[0] += 1
        await providers.refresh()
        assert providers.missing_since == {}

        await redis_client.delete(key)
        await providers.refresh()
        now[0] += 31  # gone for longer than the grace: its services go
        await providers.refresh()
        assert MeshService("shop", "cart") not in flushed(catalog)
        assert providers.followers == {}
    finally:
        for _, halt, task in providers.followers.values():
            halt.set()
            task.cancel()


def test_proxies_that_are_gone_are_pruned() -> None:
    now = [1000.0]
    catalog = Catalog(_announce, clock=lambda: now[0])
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
