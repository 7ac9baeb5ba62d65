"""The catalog's gRPC API over a real server: answers, and refusals that name the field."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.views import Identity
from trellis_catalog.sources import kinds
from trellis_catalog.transport.grpc_api import SERVICE_NAME, CatalogServicer, to_proto
from trellis_common.health import Health
from trellis_common.specdir import load_paths
from trellis_common.testing.bell import Bell
from trellis_common.testing.servicer import refused_on_the_wire, served

ROOT = Path(__file__).resolve().parents[3]
PROXY = "00000000-0000-4000-8000-00000000000{}.{}.{}"
BUYER_PROXY = PROXY.format(1, "bookbuyer", "bookbuyer")
BUYER = Identity("bookbuyer", "bookbuyer")
V1_MOVED = ProvidedService(
    provider="vm",
    namespace="bookstore",
    name="bookstore-v1",
    ports=(("http", 8080, "", 0),),
    endpoints=(ProvidedEndpoint("10.0.0.9", (("http", 8081),), service_account="bookstore"),),
)


@dataclass
class Api:
    stub: pb_grpc.CatalogAsyncStub
    catalog: Catalog
    health: Health
    metrics: CollectorRegistry


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    catalog = Catalog(Bell())
    catalog.set_documents(documents, errors)
    catalog.set_provider_services(
        "vm",
        [
            ProvidedService(
                provider="vm",
                namespace="bookstore",
                name="bookstore-v1",
                ports=(("http", 8080, "", 0),),
                endpoints=(
                    ProvidedEndpoint("10.0.0.1", (("http", 8081),), service_account="bookstore"),
                ),
            )
        ],
    )
    catalog.expect_proxy(BUYER_PROXY, "bookbuyer")
    catalog.flush()
    metrics = CollectorRegistry()
    health = Health(metrics)
    servicer = CatalogServicer(catalog, health.rejections)
    register = partial(pb_grpc.add_CatalogServicer_to_server, servicer)
    async with served(register, SERVICE_NAME) as channel:
        yield Api(pb_grpc.CatalogStub(channel), catalog, health, metrics)


async def test_well_formed_requests_are_answered(api: Api) -> None:
    view = await api.stub.GetView(pb.GetViewRequest(identity="bookbuyer/bookbuyer"))
    assert view.service_account == "bookbuyer"
    assert {o.name for o in view.outbound} >= {"bookstore-v1"}
    listed = await api.stub.ListServices(pb.ListServicesRequest(namespace="bookstore"))
    assert "bookstore-v1" in [s.name for s in listed.services]
    decision = await api.stub.CheckPolicy(
        pb.CheckPolicyRequest(
            source_namespace="bookbuyer",
            source_service_account="bookbuyer",
            destination_namespace="bookstore",
            destination_service="bookstore-v1",
        )
    )
    assert decision.allowed
    cn = PROXY.format(2, "bookstore-v1", "bookstore")
    expected = await api.stub.ExpectProxy(pb.ExpectProxyRequest(common_name=cn))
    assert (expected.identity, expected.expected) == ("bookstore/bookstore-v1", True)
    await api.stub.RegisterProxy(
        pb.RegisterProxyRequest(common_name=cn, proxy_cp="proxy-cp-0", address="10.0.0.1")
    )
    assert api.catalog.participant(api.catalog.proxies[cn])
    await api.stub.UnregisterProxy(pb.UnregisterProxyRequest(common_name=cn))
    assert not api.catalog.proxies[cn].connected
    assert api.health.rejections.items() == []


async def test_view_versions_are_listed_since_a_cursor(api: Api) -> None:
    first = await api.stub.ListViewVersions(pb.ListViewVersionsRequest())
    assert first.full
    assert {i.identity: i.version for i in first.identities} == {
        str(i): v for i, v in api.catalog.versions.items()
    }
    same = await api.stub.ListViewVersions(pb.ListViewVersionsRequest(since=first.cursor))
    assert (same.cursor, same.full, list(same.identities)) == (first.cursor, False, [])

    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", V1_MOVED)
    await api.catalog.flush_and_announce()
    changed = await api.stub.ListViewVersions(pb.ListViewVersionsRequest(since=first.cursor))
    assert not changed.full
    assert changed.cursor != first.cursor
    assert [(i.identity, i.version) for i in changed.identities] == [
        ("bookbuyer/bookbuyer", api.catalog.versions[BUYER])
    ]
    # a cursor that is not one is no error: it gets everything, which is always right
    for junk in ("garbage", "0-1", "x" * 10_000, "\x00-1"):
        answer = await api.stub.ListViewVersions(pb.ListViewVersionsRequest(since=junk))
        assert answer.full
        assert len(answer.identities) == len(api.catalog.versions)
    assert api.health.rejections.items() == []


async def test_destinations_are_listed_whole_then_since_a_cursor(api: Api) -> None:
    first = await api.stub.ListDestinations(pb.ListDestinationsRequest())
    assert first.full
    by_name = {f"{d.namespace}/{d.name}": d for d in first.destinations}
    assert set(by_name) == {str(s) for s in api.catalog.services}
    v1 = by_name["bookstore/bookstore-v1"]
    [port] = v1.ports
    assert (port.port, [(e.address, e.port) for e in port.endpoints]) == (
        14001,
        [("10.0.0.1", 8081)],
    )
    assert [e.service_account for e in port.endpoints] == ["bookstore"]
    # the bookstore example's TrafficTarget to bookstore allows HTTPRouteGroup matches
    assert [(r.name, r.match.path_regex, list(r.match.methods)) for r in v1.routes] == [
        ("books-bought", "/books-bought", ["GET"]),
        ("buy-a-book", ".*a-book.*new", ["GET"]),
    ]
    split = by_name["bookstore/bookstore"]
    assert split.split == "bookstore/bookstore-split"
    assert {(b.name, b.weight) for b in split.splits} == {
        ("bookstore-v1", 80),
        ("bookstore-v2", 20),
    }

    same = await api.stub.ListDestinations(pb.ListDestinationsRequest(since=first.cursor))
    assert (same.cursor, same.full, list(same.destinations)) == (first.cursor, False, [])

    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", V1_MOVED)
    api.catalog.flush()
    moved = await api.stub.ListDestinations(pb.ListDestinationsRequest(since=first.cursor))
    assert not moved.full
    assert [d.name for d in moved.destinations] == ["bookstore-v1"]
    assert [e.address for e in moved.destinations[0].ports[0].endpoints] == ["10.0.0.9"]
    assert moved.destinations[0].version != v1.version

    api.catalog.remove_provider_service("vm", "bookstore", "bookstore-v1")
    api.catalog.flush()
    gone = await api.stub.ListDestinations(pb.ListDestinationsRequest(since=moved.cursor))
    # a declared Service without endpoints still exists; one nobody knows is removed
    assert [(d.name, len(d.ports[0].endpoints)) for d in gone.destinations] == [("bookstore-v1", 0)]
    vm_only = replace(V1_MOVED, name="reports")
    api.catalog.update_provider_service("vm", "bookstore", "reports", vm_only)
    api.catalog.flush()
    api.catalog.remove_provider_service("vm", "bookstore", "reports")
    api.catalog.flush()
    removed = await api.stub.ListDestinations(pb.ListDestinationsRequest(since=gone.cursor))
    assert (list(removed.destinations), list(removed.removed)) == ([], ["bookstore/reports"])
    assert api.health.rejections.items() == []


async def test_an_expected_proxy_with_an_invalid_account_is_refused_and_not_recorded(
    api: Api,
) -> None:
    cn = PROXY.format(3, "bookstore-v1", "bookstore")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await api.stub.ExpectProxy(
            pb.ExpectProxyRequest(common_name=cn, service_account="Bad Name!")
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(
        "service_account: 'Bad Name!' is not a valid DNS-1123 subdomain"
    )
    assert cn not in api.catalog.proxies
    assert api.catalog.flush() is None  # nothing to recompute, nothing broken


async def test_an_unknown_proxy_is_not_found(api: Api) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await api.stub.UnregisterProxy(
            pb.UnregisterProxyRequest(common_name=PROXY.format(9, "nobody", "nowhere"))
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def _policy(**fields: str) -> pb.CheckPolicyRequest:
    base = {
        "source_namespace": "bookbuyer",
        "source_service_account": "bookbuyer",
        "destination_namespace": "bookstore",
        "destination_service": "bookstore-v1",
    }
    return pb.CheckPolicyRequest(**{**base, **fields})


@pytest.mark.parametrize(
    ("rpc", "request_", "message"),
    [
        ("GetView", pb.GetViewRequest(), "identity: is required"),
        ("GetView", pb.GetViewRequest(identity="bookbuyer"), "identity: must be '<namespace>/"),
        (
            "GetView",
            pb.GetViewRequest(identity="bookbuyer/Bad Name!"),
            "identity: 'Bad Name!' is not a valid DNS-1123 label",
        ),
        (
            "GetView",
            pb.GetViewRequest(identity="bookbuyer/bookbuyer", service_account="Bad Name!"),
            "service_account: 'Bad Name!' is not a valid DNS-1123 subdomain",
        ),
        (
            "ListServices",
            pb.ListServicesRequest(namespace="Bad Name!"),
            "namespace: 'Bad Name!' is not a valid DNS-1123 label",
        ),
        ("CheckPolicy", _policy(source_namespace=""), "source_namespace: is required"),
        (
            "CheckPolicy",
            _policy(source_service_account="Bad Name!"),
            "source_service_account: 'Bad Name!' is not a valid DNS-1123 subdomain",
        ),
        (
            "CheckPolicy",
            _policy(destination_namespace="Book_Store"),
            "destination_namespace: 'Book_Store' is not a valid DNS-1123 label",
        ),
        (
            "CheckPolicy",
            _policy(destination_service="bookstore.v1"),
            "destination_service: 'bookstore.v1' is not a valid DNS-1123 label",
        ),
        (
            "ExpectProxy",
            pb.ExpectProxyRequest(common_name="not-a-proxy"),
            "common_name: 'not-a-proxy' is not a valid '<proxy-uuid>.<service>.<namespace>'",
        ),
        (
            "RegisterProxy",
            pb.RegisterProxyRequest(common_name=BUYER_PROXY, address="10.0.0.300"),
            "address: must be an IP address, got '10.0.0.300'",
        ),
        (
            "RegisterProxy",
            pb.RegisterProxyRequest(common_name=BUYER_PROXY, proxy_cp="proxy cp\n"),
            "proxy_cp: must be printable with no spaces",
        ),
        (
            "UnregisterProxy",
            pb.UnregisterProxyRequest(common_name=""),
            "common_name: is required",
        ),
    ],
)
async def test_every_rpc_refuses_invalid_requests_naming_the_field_and_counts_them(
    api: Api, rpc: str, request_: object, message: str
) -> None:
    proxies = dict(api.catalog.proxies)
    call = getattr(api.stub, rpc)(request_)
    await refused_on_the_wire(call, rpc, message, api.health.rejections)
    assert api.metrics.get_sample_value("trellis_rejected_records_total", {"source": "grpc"}) == 1
    assert api.catalog.proxies == proxies
    assert not api.catalog.proxies[BUYER_PROXY].connected


def test_a_view_carries_only_the_endpoints_its_identity_may_reach(api: Api) -> None:
    two_accounts = replace(
        V1_MOVED,
        endpoints=(
            ProvidedEndpoint("10.0.0.9", (("http", 8081),), service_account="bookstore"),
            ProvidedEndpoint("10.0.0.8", (("http", 8081),), service_account="bookstore-canary"),
        ),
    )
    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", two_accounts)
    api.catalog.flush()
    view = to_proto(api.catalog, api.catalog.policy_for(BUYER))
    [cluster] = [c for c in view.clusters if c.name == "bookstore/bookstore-v1|14001"]
    # the example's TrafficTarget lets bookbuyer call the account bookstore only
    assert [e.address for e in cluster.endpoints] == ["10.0.0.9"]
    assert list(cluster.spiffe_ids) == ["spiffe://cluster.local/ns/bookstore/sa/bookstore"]
    # the cluster itself keeps both, for views that may reach both
    state = api.catalog.clusters["bookstore/bookstore-v1|14001"]
    assert sorted(e.address for e in state.endpoints) == ["10.0.0.8", "10.0.0.9"]
