"""The Destination API's pieces: names, the update rules, context tokens, and the stream
discipline (a slow client's overflow ends its stream only) over a real gRPC server."""

from __future__ import annotations

import asyncio
from functools import partial

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import catalog_pb2 as cpb
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import destination_pb2_grpc as dpb_grpc
from trellis_proxy_cp.clients.destinations import DestinationTable
from trellis_proxy_cp.discovery import testing as dt
from trellis_proxy_cp.discovery.server import (
    LINKERD_SERVICE,
    ContextToken,
    Discovery,
    DiscoveryMetrics,
    DiscoveryOptions,
    LinkerdDestination,
)
from trellis_proxy_cp.discovery.updates import Resolved, get_updates
from trellis_proxy_cp.translate import linkerd
from trellis_runtime.grpcserver import GrpcServer
from trellis_runtime.metrics import MetricFactory


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("web.shop.svc.cluster.local:8080", ("shop", "web", "", "", 8080)),
        ("web.shop.svc.cluster.local", ("shop", "web", "", "", 80)),
        ("WEB.Shop.svc.cluster.local.:80", ("shop", "web", "", "", 80)),
        ("web-0.web.shop.svc.cluster.local:80", ("shop", "web", "web-0", "", 80)),
        # as upstream's parseK8sServiceName: a service is named in full, or it is a host
        ("web.shop:9090", ("", "", "", "", 9090)),
        ("web.shop.svc:1", ("", "", "", "", 1)),
        ("a.b.c.d.svc.cluster.local:1", ("", "", "", "", 1)),
        ("10.1.2.3:8080", ("", "", "", "10.1.2.3", 8080)),
        ("[fd00::1]:443", ("", "", "", "fd00::1", 443)),
        ("api.example.com:443", ("", "", "", "", 443)),
    ],
)
def test_paths_name_a_service_an_instance_an_address_or_a_host(
    path: str, expected: tuple[str, str, str, str, int]
) -> None:
    found = linkerd.parse_authority(path)
    assert (found.namespace, found.service, found.instance, found.ip, found.port) == expected
    if not found.ip:
        assert found.host == path.lower().rsplit(":", 1)[0].rstrip(".")


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("", "path is empty"),
        ("web", "names no namespace"),
        ("web_1.shop:80", "not a valid DNS-1123 label"),
        ("web.shop:0", "not a number in 1..65535"),
        ("web.shop:http", "not a number in 1..65535"),
        ("web.shop:", "the port is empty"),
        ("[fd00::1:80", "unbalanced brackets"),
        ("a" * 400, "at most 300"),
    ],
)
def test_a_malformed_path_is_refused_with_the_reason(path: str, reason: str) -> None:
    with pytest.raises(linkerd.InvalidAuthority, match=reason):
        linkerd.parse_authority(path)


def addr(port: int) -> dpb.WeightedAddr:
    return dpb.WeightedAddr(addr=linkerd.tcp_address("10.0.0.1", port), weight=10000)


def state(*ports: int, exists: bool = True) -> Resolved:
    return Resolved(exists, {("10.0.0.1", p): addr(p) for p in ports})


def kinds(updates: list[dpb.Update]) -> list[str]:
    found = []
    for update in updates:
        kind = update.WhichOneof("update")
        if kind == "no_endpoints":
            found.append(f"no_endpoints({str(update.no_endpoints.exists).lower()})")
        elif kind == "add":
            found.append(f"add{[a.addr.port for a in update.add.addrs]}")
        else:
            found.append(f"remove{[a.port for a in update.remove.addrs]}")
    return found


@pytest.mark.parametrize(
    ("before", "now", "expected"),
    [
        (None, state(1, 2), ["add[1, 2]"]),
        (None, state(), ["no_endpoints(true)"]),
        (None, state(exists=False), ["no_endpoints(false)"]),
        (state(1), state(1, 2), ["add[2]"]),
        # make before break: what came is added before what went is removed
        (state(1, 2), state(2, 3), ["add[3]", "remove[1]"]),
        (state(1), state(1), []),
        (state(1), state(), ["no_endpoints(true)"]),
        (state(1), state(exists=False), ["no_endpoints(false)"]),
        (state(), state(exists=False), ["no_endpoints(false)"]),
        (state(exists=False), state(), ["no_endpoints(true)"]),
        (state(exists=False), state(4), ["add[4]"]),
        (state(exists=False), state(exists=False), []),
        (state(), state(), []),
    ],
)
def test_the_updates_between_two_states(
    before: Resolved | None, now: Resolved, expected: list[str]
) -> None:
    assert kinds(get_updates(before, now, {})) == expected


def test_an_endpoint_whose_metadata_changed_is_added_again() -> None:
    moved = state(1)
    moved.addresses["10.0.0.1", 1].weight = 20000
    assert kinds(get_updates(state(1), moved, {})) == ["add[1]"]


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        (
            '{"ns":"shop", "nodeName":"node-1", "pod":"web-1"}\n',
            ContextToken("shop", "node-1", "web-1"),
        ),
        ('{"ns":"shop", "other": 1}', ContextToken("shop")),
        ("ns:shop", ContextToken("shop")),
        ("", ContextToken()),
        ("garbage", ContextToken()),
        ("[1, 2]", ContextToken()),
    ],
)
def test_context_tokens_are_read_as_linkerd_reads_them(token: str, expected: ContextToken) -> None:
    assert ContextToken.parse(token) == expected


def destination(version: int, ports: range) -> cpb.Destination:
    endpoints = [cpb.ClusterEndpoint(address="10.0.0.1", port=p) for p in ports]
    cluster = cpb.Cluster(name="shop/web|80", port=80, protocol="http", endpoints=endpoints)
    return cpb.Destination(namespace="shop", name="web", version=str(version), ports=[cluster])


async def read(call: object) -> dpb.Update:
    message = await asyncio.wait_for(call.read(), 5)  # type: ignore[attr-defined]
    assert isinstance(message, dpb.Update)
    return message


async def drain(call: object) -> None:
    """Read until the stream ends (raises its error)."""
    while True:
        await read(call)


async def test_a_client_that_stops_reading_loses_its_stream_and_no_other_waits() -> None:
    table = DestinationTable()
    table.apply([destination(0, range(1, 2))], [])
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(MetricFactory(registry, "test"))
    catalog = dt.CatalogViews({dt.CALLER.identity: dt.view("shop/web")})
    discovery = Discovery(table, DiscoveryOptions(queue_capacity=2), metrics, dt.access(catalog))
    register = partial(dpb_grpc.add_DestinationServicer_to_server, LinkerdDestination(discovery))
    server = GrpcServer("127.0.0.1:0", [register], [LINKERD_SERVICE], grace=0.1)
    stop = asyncio.Event()
    await server.start()
    running = asyncio.create_task(server.run(stop))
    # each client on its own connection, with gRPC's flow control windows left small (no
    # BDP probing): a client that does not read stops the server's writes to it
    options = [("grpc.http2.bdp_probe", 0)]
    address = f"127.0.0.1:{server.port}"
    async with (
        grpc.aio.insecure_channel(address, options=options) as slow_channel,
        grpc.aio.insecure_channel(address, options=options) as fast_channel,
    ):
        request = dpb.GetDestination(path="web.shop.svc.cluster.local:80")
        slow = dpb_grpc.DestinationStub(slow_channel).Get(request)
        fast = dpb_grpc.DestinationStub(fast_channel).Get(request)
        assert (await read(slow)).WhichOneof("update") == "add"
        assert (await read(fast)).WhichOneof("update") == "add"
        # big updates, faster than `slow` reads (it does not): its writer blocks on flow
        # control, its queue fills, and the stream ends; `fast` gets every update
        for version in range(1, 40):
            start = version * 1000
            table.apply([destination(version, range(start, start + 1000))], [])
            last = await read(fast)
            while last.WhichOneof("update") == "remove":
                last = await read(fast)
            assert [a.addr.port for a in last.add.addrs][:1] == [start]
            await asyncio.sleep(0)
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await drain(slow)
        assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "reads too slowly" in (ended.value.details() or "")
        fast.cancel()
    stop.set()
    await running
    overflowed = registry.get_sample_value(
        "test_destination_refused_total", {"code": "RESOURCE_EXHAUSTED", "reason": "overflow"}
    )
    assert overflowed == 1
    assert table.watching == 0  # both streams stopped watching


def test_a_profile_marks_routes_retryable_when_a_retry_policy_names_the_service() -> None:
    service = destination(1, range(1, 2))
    service.routes.append(
        cpb.ProfileRoute(name="items", match=cpb.HttpMatch(path_regex="/items", methods=["GET"]))
    )
    budget = linkerd.RetryBudget()
    [plain] = linkerd.profile(service, 80, budget, "cluster.local").routes
    assert not plain.is_retryable
    service.retried = True
    [retried] = linkerd.profile(service, 80, budget, "cluster.local").routes
    assert retried.is_retryable
    assert retried.metrics_labels == {"route": "items"}
