"""What the Destination API answers, name by name: ServiceEntries (resolved by DNS: let the
client fall back to it), upstream's rules for names and IP addresses, instance names,
profiles from Gateway API routes (matches, timeouts, backends) and opaque ports. The client
over gRPC is generated from upstream's protos, as a Linkerd proxy's is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from functools import partial

import grpc
import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from trellis_api import catalog_pb2 as cpb
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import destination_pb2_grpc as dpb_grpc
from trellis_proxy_cp.clients.destinations import DestinationTable
from trellis_proxy_cp.discovery import rest
from trellis_proxy_cp.discovery import testing as dt
from trellis_proxy_cp.discovery.server import (
    LINKERD_SERVICE,
    Discovery,
    DiscoveryMetrics,
    DiscoveryOptions,
    LinkerdDestination,
)
from trellis_proxy_cp.translate import linkerd
from trellis_runtime.grpcserver import GrpcServer
from trellis_runtime.metrics import MetricFactory


def endpoint(address: str, port: int, workload: str = "") -> cpb.ClusterEndpoint:
    return cpb.ClusterEndpoint(
        address=address, port=port, workload=workload, service_account="web", weight=1
    )


def service(
    name: str = "web",
    port: int = 80,
    protocol: str = "http",
    endpoints: tuple[cpb.ClusterEndpoint, ...] = (),
    *,
    routes: tuple[cpb.ProfileRoute, ...] = (),
    splits: tuple[cpb.SplitBackend, ...] = (),
    opaque_ports: tuple[int, ...] = (),
) -> cpb.Destination:
    cluster = cpb.Cluster(
        name=f"shop/{name}|{port}",
        port=port,
        protocol=protocol,
        discovery="STATIC",
        mesh_tls=True,
        endpoints=endpoints,
    )
    return cpb.Destination(
        namespace="shop",
        name=name,
        version="1",
        ports=[cluster],
        trust_domain="td",
        routes=routes,
        splits=splits,
        opaque_ports=opaque_ports,
    )


def service_entry(name: str, host: str, discovery: str, *addresses: str) -> cpb.Destination:
    cluster = cpb.Cluster(
        name=f"shop/{name}|443",
        port=443,
        protocol="tcp",
        discovery=discovery,
        endpoints=[cpb.ClusterEndpoint(address=a, port=443) for a in addresses],
    )
    return cpb.Destination(namespace="shop", name=name, version="1", hosts=[host], ports=[cluster])


DESTINATIONS = [
    service(endpoints=(endpoint("10.0.0.1", 8080, "shop/web-0"), endpoint("10.0.0.2", 8080))),
    service_entry("api", "api.example.com", "DNS", "api.example.com"),
    service_entry("pinned", "pinned.example.com", "DNS", "192.0.2.7"),
    service_entry("static", "static.example.com", "STATIC", "192.0.2.8", "192.0.2.9"),
    service_entry("passthrough", "any.example.com", "PASSTHROUGH"),
    service_entry("logical", "one.example.com", "LOGICAL_DNS", "one.example.com"),
    service_entry("socket", "local.example.com", "STATIC", "unix:///run/app.sock"),
    service_entry("empty", "empty.example.com", "STATIC"),
]


@pytest.fixture
def discovery() -> Discovery:
    table = DestinationTable()
    table.apply(DESTINATIONS, [])
    metrics = DiscoveryMetrics(MetricFactory(CollectorRegistry(), "test"))
    names = [f"shop/{d.name}" for d in DESTINATIONS]
    catalog = dt.CatalogViews({dt.CALLER.identity: dt.view(*names)})
    return Discovery(table, DiscoveryOptions(), metrics, dt.access(catalog))


def target(path: str) -> linkerd.Authority:
    return linkerd.parse_authority(path)


@pytest.mark.parametrize(
    ("path", "exists", "addresses"),
    [
        # resolved by DNS, nothing to send: exists false, so the client falls back to DNS
        ("api.example.com:443", False, []),
        ("any.example.com:443", False, []),
        ("static.example.com:80", False, []),  # not one of its ports
        ("one.example.com:443", False, []),
        ("local.example.com:443", False, []),  # a socket on Envoy's host: not for Linkerd
        ("empty.example.com:443", True, []),  # static, and no endpoint: none to fall back to
        # resolved addresses, when the ServiceEntry has them
        ("pinned.example.com:443", True, [("192.0.2.7", 443)]),
        ("static.example.com:443", True, [("192.0.2.8", 443), ("192.0.2.9", 443)]),
        # an instance: that one endpoint (a pod, a StatefulSet pod's DNS name, a VM workload)
        ("web-0.web.shop.svc.cluster.local:80", True, [("10.0.0.1", 8080)]),
        ("web-9.web.shop.svc.cluster.local:80", True, []),
        ("web.shop.svc.cluster.local:80", True, [("10.0.0.1", 8080), ("10.0.0.2", 8080)]),
    ],
)
def test_get_answers(
    discovery: Discovery, path: str, exists: bool, addresses: list[tuple[str, int]]
) -> None:
    discovery.check(target(path), "Get")
    resolved = discovery.resolve(target(path))
    assert (resolved.exists, sorted(resolved.addresses)) == (exists, addresses)
    assert resolved.owner  # the caller's access is checked against its owner


@pytest.mark.parametrize(
    ("path", "rpc", "reason"),
    [
        ("10.0.0.1:8080", "Get", "IP queries not supported by Get API: host=10.0.0.1"),
        ("[fd00::1]:80", "Get", "IP queries not supported by Get API: host=fd00::1"),
        ("web.shop:80", "Get", "not <service>.<namespace>.svc.cluster.local"),
        ("web.shop.svc:80", "GetProfile", "not <service>.<namespace>.svc.cluster.local"),
        ("unknown.example.com:443", "Get", "nor a ServiceEntry host"),
        ("unknown.example.com:443", "GetProfile", "nor a ServiceEntry host"),
    ],
)
def test_names_upstream_refuses_are_invalid_arguments(
    discovery: Discovery, path: str, rpc: str, reason: str
) -> None:
    with pytest.raises(linkerd.InvalidAuthority, match=reason.replace("[", r"\[")):
        discovery.check(target(path), rpc)


@pytest.mark.parametrize(
    "path",
    ["10.0.0.1:8080", "api.example.com:443", "nothing.shop.svc.cluster.local:80"],
)
def test_get_profile_answers_addresses_hosts_and_unknown_services(
    discovery: Discovery, path: str
) -> None:
    discovery.check(target(path), "GetProfile")


def test_a_service_entrys_profile_names_no_service(discovery: Discovery) -> None:
    answer = discovery.profile(target("static.example.com:443"))
    assert answer.fully_qualified_name == ""
    assert not answer.HasField("parent_ref")
    assert answer.opaque_protocol  # a TCP port
    web = discovery.profile(target("web.shop.svc.cluster.local:80"))
    assert web.fully_qualified_name == "web.shop.svc.cluster.local"
    assert web.parent_ref.resource.kind == "Service"


def test_an_instance_names_its_endpoints_profile(discovery: Discovery) -> None:
    answer = discovery.profile(target("web-0.web.shop.svc.cluster.local:80"))
    assert linkerd.address_text(answer.endpoint.addr) == "10.0.0.1:8080"
    assert answer.endpoint.resource_ref.resource.name == "web-0"
    assert answer.fully_qualified_name == ""
    unknown = discovery.profile(target("web-9.web.shop.svc.cluster.local:80"))
    assert not unknown.HasField("endpoint")


def test_profile_routes_from_gateway_api_rules() -> None:
    web = service(
        routes=(
            cpb.ProfileRoute(
                name="HTTPRoute shop/web rule 0",
                match=cpb.HttpMatch(path_exact="/health", methods=["GET"]),
                timeout=2.5,
                port=80,
            ),
            cpb.ProfileRoute(
                name="GRPCRoute shop/web rule 1",
                match=cpb.HttpMatch(path_prefix="/shop.Cart"),
            ),
            cpb.ProfileRoute(name="other port", match=cpb.HttpMatch(), port=8080),
        ),
        splits=(
            cpb.SplitBackend(namespace="shop", name="web-v1", weight=3, port=8080),
            cpb.SplitBackend(namespace="shop", name="web-v2", weight=1),
        ),
    )
    answer = linkerd.profile(web, 80, linkerd.RetryBudget(), "cluster.local")
    [health, cart] = answer.routes
    assert health.condition.all.matches[0].path.regex == "/health"
    assert health.timeout.ToNanoseconds() == 2_500_000_000
    assert cart.condition.path.regex == r"/shop\.Cart(?:/.*)?"
    assert not cart.HasField("timeout")
    assert [(d.authority, d.weight, d.backend_ref.resource.port) for d in answer.dst_overrides] == [
        ("web-v1.shop.svc.cluster.local:8080", 7500, 8080),
        ("web-v2.shop.svc.cluster.local:80", 2500, 80),
    ]


def test_opaque_ports_hint_opaque_and_mark_the_profile_opaque() -> None:
    postgres = service("db", 5432, "http", (endpoint("10.0.0.3", 5432),), opaque_ports=(25, 5432))
    table = DestinationTable()
    table.apply([postgres], [])
    [addr] = linkerd.addresses(postgres, 5432, "cluster.local").values()
    assert addr.protocol_hint.WhichOneof("protocol") == "opaque"
    assert not addr.protocol_hint.HasField("opaque_transport")  # Envoy has no such port
    assert linkerd.profile(postgres, 5432, linkerd.RetryBudget(), "cluster.local").opaque_protocol
    plain = service("web", 80, "grpc", (endpoint("10.0.0.4", 80),), opaque_ports=(25,))
    [h2] = linkerd.addresses(plain, 80, "cluster.local").values()
    assert h2.protocol_hint.WhichOneof("protocol") == "h2"
    assert not linkerd.profile(plain, 80, linkerd.RetryBudget(), "cluster.local").opaque_protocol


# -- over gRPC, as a Linkerd proxy asks -------------------------------------------------


@pytest.fixture
async def stub(discovery: Discovery) -> AsyncIterator[dpb_grpc.DestinationStub]:
    register = partial(dpb_grpc.add_DestinationServicer_to_server, LinkerdDestination(discovery))
    server = GrpcServer("127.0.0.1:0", [register], [LINKERD_SERVICE], grace=0.1)
    stop = asyncio.Event()
    await server.start()
    running = asyncio.create_task(server.run(stop))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield dpb_grpc.DestinationStub(channel)
    stop.set()
    await running


async def first(call: object) -> object:
    return await asyncio.wait_for(call.read(), 5)  # type: ignore[attr-defined]


async def test_a_dns_service_entry_lets_the_client_fall_back_to_dns(
    stub: dpb_grpc.DestinationStub,
) -> None:
    call = stub.Get(dpb.GetDestination(path="api.example.com:443"))
    update = await first(call)
    assert update == dpb.Update(no_endpoints=dpb.NoEndpoints(exists=False))
    call.cancel()


@pytest.mark.parametrize(
    ("rpc", "path"),
    [("Get", "10.0.0.1:8080"), ("Get", "web.shop:80"), ("GetProfile", "unknown.example.com")],
)
async def test_refused_names_end_the_stream_invalid_argument(
    stub: dpb_grpc.DestinationStub, rpc: str, path: str
) -> None:
    call = getattr(stub, rpc)(dpb.GetDestination(path=path))
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await first(call)
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_get_profile_by_ip_still_answers(stub: dpb_grpc.DestinationStub) -> None:
    call = stub.GetProfile(dpb.GetDestination(path="10.0.0.2:8080"))
    answer = await first(call)
    assert isinstance(answer, dpb.DestinationProfile)
    assert linkerd.address_text(answer.endpoint.addr) == "10.0.0.2:8080"
    call.cancel()


async def test_a_replaced_address_is_added_before_the_old_one_is_removed(
    discovery: Discovery, stub: dpb_grpc.DestinationStub
) -> None:
    call = stub.Get(dpb.GetDestination(path="web.shop.svc.cluster.local:80"))
    first_set = await first(call)
    assert isinstance(first_set, dpb.Update)
    assert len(first_set.add.addrs) == 2
    replaced = endpoint("10.0.0.3", 8080)  # 10.0.0.2's workload, at a new address
    moved = service(endpoints=(endpoint("10.0.0.1", 8080, "shop/web-0"), replaced))
    moved.version = "2"
    discovery.table.apply([moved], [])
    added, removed = await first(call), await first(call)
    assert isinstance(added, dpb.Update)
    assert isinstance(removed, dpb.Update)
    assert [linkerd.address_text(a.addr) for a in added.add.addrs] == ["10.0.0.3:8080"]
    assert [linkerd.address_text(a) for a in removed.remove.addrs] == ["10.0.0.2:8080"]
    call.cancel()


async def test_the_admin_twin_refuses_what_the_api_refuses(discovery: Discovery) -> None:
    app = FastAPI()
    rest.add_routes(app, discovery, lambda: None)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        by_ip = await client.get("/v1/destinations/get", params={"path": "10.0.0.1:8080"})
        assert by_ip.status_code == 422
        assert "IP queries not supported" in by_ip.text
        profile = await client.get("/v1/destinations/profile", params={"path": "10.0.0.1:8080"})
        assert profile.status_code == 200
        dns = await client.get("/v1/destinations/get", params={"path": "api.example.com:443"})
        assert dns.json()["exists"] is False
