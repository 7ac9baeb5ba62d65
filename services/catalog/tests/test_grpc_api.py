"""The catalog's gRPC API over a real server: answers, and refusals that name the field."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.sources import kinds
from trellis_catalog.transport.grpc_api import SERVICE_NAME, CatalogServicer, to_proto
from trellis_common.specdir import load_paths
from trellis_runtime.health import Health
from trellis_testing.servicer import refused_on_the_wire, served

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
    catalog = Catalog()
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


async def _answer(call: Any) -> pb.ListChangesResponse:
    """A watch's next answer (at most 5 s away)."""
    answer = await asyncio.wait_for(call.read(), 5)
    assert isinstance(answer, pb.ListChangesResponse), answer
    return answer


def _changes(answer: pb.ListChangesResponse) -> list[tuple[str, str]]:
    return [(c.name, c.version) for c in answer.changes]


async def _get(
    api: Api, *names: str, accounts: dict[str, str] | None = None
) -> pb.GetResourcesResponse:
    return await api.stub.GetResources(
        pb.GetResourcesRequest(names=names, service_accounts=accounts or {})
    )


async def test_changes_are_listed_since_a_cursor(api: Api) -> None:
    first = await api.stub.ListChanges(pb.ListChangesRequest())
    assert first.full
    assert dict(_changes(first)) == api.catalog.resources.versions
    kinds = {name.split("/")[0] for name, _ in _changes(first)}
    assert kinds == {"policy", "slice", "destination"}
    assert ("policy/bookbuyer/bookbuyer", api.catalog.resources.versions[f"policy/{BUYER}"]) in (
        _changes(first)
    )
    same = await api.stub.ListChanges(pb.ListChangesRequest(since=first.cursor))
    assert (same.cursor, same.full, list(same.changes)) == (first.cursor, False, [])

    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", V1_MOVED)
    await api.catalog.flush_and_announce()
    changed = await api.stub.ListChanges(pb.ListChangesRequest(since=first.cursor))
    assert not changed.full
    assert changed.cursor != first.cursor
    # the cluster's slice and the service's destination; no policy moves
    versions = api.catalog.resources.versions
    destination, slice_ = "destination/bookstore/bookstore-v1", "slice/bookstore/bookstore-v1|14001"
    assert _changes(changed) == [(destination, versions[destination]), (slice_, versions[slice_])]
    # a cursor that is not one is no error: it gets everything, which is always right
    for junk in ("garbage", "0-1", "x" * 10_000, "\x00-1"):
        answer = await api.stub.ListChanges(pb.ListChangesRequest(since=junk))
        assert answer.full
        assert len(answer.changes) == len(versions)
    assert api.health.rejections.items() == []


async def test_a_watch_answers_at_once_then_after_each_flush_that_moved_something(
    api: Api,
) -> None:
    """WatchChanges: ListChanges' answer first, then one per flush that moved a resource
    (what moved since the answer before), the moved slices and destinations inline at the
    versions listed, exactly as GetResources answers them; a flush that moved nothing
    sends nothing."""
    call = api.stub.WatchChanges(pb.ListChangesRequest())
    try:
        first = await _answer(call)
        assert first.full
        assert dict(_changes(first)) == api.catalog.resources.versions
        assert list(first.resources) == []  # a full listing carries nothing inline

        api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", V1_MOVED)
        await api.catalog.flush_and_announce()
        moved = await _answer(call)
        versions = api.catalog.resources.versions
        destination, slice_ = (
            "destination/bookstore/bookstore-v1",
            "slice/bookstore/bookstore-v1|14001",
        )
        assert not moved.full
        assert _changes(moved) == [(destination, versions[destination]), (slice_, versions[slice_])]
        assert list(moved.resources) == list((await _get(api, destination, slice_)).resources)
        assert moved.cursor == api.catalog.resources.cursor

        await api.catalog.flush_and_announce()  # nothing moved: no answer
        api.catalog.remove_provider_service("vm", "bookstore", "bookstore-v1")
        await api.catalog.flush_and_announce()
        back = await _answer(call)
        assert back.cursor != moved.cursor
        assert {c.name for c in back.changes} >= {destination, slice_}
    finally:
        call.cancel()


async def test_a_watch_from_a_cursor_sends_only_what_moved_after_it(api: Api) -> None:
    listed = await api.stub.ListChanges(pb.ListChangesRequest())
    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", V1_MOVED)
    await api.catalog.flush_and_announce()
    call = api.stub.WatchChanges(pb.ListChangesRequest(since=listed.cursor))
    try:
        first = await _answer(call)
        assert not first.full
        assert [c.name for c in first.changes] == [
            "destination/bookstore/bookstore-v1",
            "slice/bookstore/bookstore-v1|14001",
        ]
        assert len(first.resources) == 2
    finally:
        call.cancel()


async def test_destinations_are_listed_then_fetched_by_name(api: Api) -> None:
    first = await api.stub.ListChanges(pb.ListChangesRequest())
    names = [n for n, _ in _changes(first) if n.startswith("destination/")]
    assert set(names) == {f"destination/{s}" for s in api.catalog.services}
    fetched = await _get(api, *names)
    assert list(fetched.missing) == []
    assert [r.name for r in fetched.resources] == names
    assert all(r.WhichOneof("body") == "destination" for r in fetched.resources)
    assert {r.name: r.version for r in fetched.resources} == {
        n: v for n, v in _changes(first) if n in names
    }
    by_name = {r.name.removeprefix("destination/"): r.destination for r in fetched.resources}
    assert all(k == f"{d.namespace}/{d.name}" for k, d in by_name.items())
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

    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", V1_MOVED)
    api.catalog.flush()
    moved = await api.stub.ListChanges(pb.ListChangesRequest(since=first.cursor))
    assert not moved.full
    [(name, version)] = [(n, v) for n, v in _changes(moved) if n.startswith("destination/")]
    assert (name, version != v1.version) == ("destination/bookstore/bookstore-v1", True)
    [again] = (await _get(api, name)).resources
    assert again.version == again.destination.version == version
    assert [e.address for e in again.destination.ports[0].endpoints] == ["10.0.0.9"]

    api.catalog.remove_provider_service("vm", "bookstore", "bookstore-v1")
    api.catalog.flush()
    gone = await api.stub.ListChanges(pb.ListChangesRequest(since=moved.cursor))
    # a declared Service without endpoints still exists; one nobody knows is removed
    [(name, version)] = [(n, v) for n, v in _changes(gone) if n.startswith("destination/")]
    assert name == "destination/bookstore/bookstore-v1"
    assert version != ""
    [empty] = (await _get(api, name)).resources
    assert len(empty.destination.ports[0].endpoints) == 0
    vm_only = replace(V1_MOVED, name="reports")
    api.catalog.update_provider_service("vm", "bookstore", "reports", vm_only)
    api.catalog.flush()
    api.catalog.remove_provider_service("vm", "bookstore", "reports")
    api.catalog.flush()
    removed = await api.stub.ListChanges(pb.ListChangesRequest(since=gone.cursor))
    listed = _changes(removed)
    assert [(n, v) for n, v in listed if n.startswith("destination/")] == [
        ("destination/bookstore/reports", "")
    ]
    # bookbuyer may call its account: it reached it for a while, through a slice now gone
    assert ("slice/bookstore/reports|8080", "") in listed
    assert "policy/bookbuyer/bookbuyer" in dict(listed)
    missing = await _get(api, "destination/bookstore/reports")
    assert (list(missing.resources), list(missing.missing)) == (
        [],
        ["destination/bookstore/reports"],
    )
    assert api.health.rejections.items() == []


async def test_resources_are_fetched_by_name_and_policies_computed_on_demand(api: Api) -> None:
    batch_job = "policy/bookbuyer/batch-job"
    unknown = "slice/bookstore/nothing|80"
    accounts = {"bookbuyer/batch-job": "bookbuyer"}
    answer = await _get(api, batch_job, f"policy/{BUYER}", unknown, batch_job, accounts=accounts)
    # asked twice, answered once; an unknown slice comes back missing
    assert [r.name for r in answer.resources] == [batch_job, f"policy/{BUYER}"]
    assert list(answer.missing) == [unknown]
    job, buyer = answer.resources
    # batch-job has no stored policy: it is computed on demand, for the account given
    assert batch_job not in api.catalog.resources.versions
    assert job.WhichOneof("body") == "policy"
    assert job.policy.identity == "bookbuyer/batch-job"
    assert job.policy.service_account == "bookbuyer"
    assert {o.name for o in job.policy.outbound} >= {"bookstore-v1"}
    assert job.policy.version == job.version != ""
    # and the slices it names are there to fetch, though it is no stored policy
    named = (await _get(api, *(c.slice for c in job.policy.clusters))).resources
    assert [r.name for r in named] == [c.slice for c in job.policy.clusters] != []
    # a stored one comes with its published version; its clusters name their slices
    assert buyer.version == api.catalog.resources.versions[f"policy/{BUYER}"]
    slices = {c.name: c.slice for c in buyer.policy.clusters}
    assert slices["bookstore/bookstore-v1|14001"] == "slice/bookstore/bookstore-v1|14001"
    assert all(len(c.endpoints) == 0 for c in buyer.policy.clusters)
    [found] = (await _get(api, slices["bookstore/bookstore-v1|14001"])).resources
    assert found.version == api.catalog.resources.versions[found.name]
    assert [e.address for e in found.slice.endpoints] == ["10.0.0.1"]

    # once batch-job's proxy is expected, the catalog stores the same policy, same version
    api.catalog.expect_proxy(PROXY.format(4, "batch-job", "bookbuyer"), "bookbuyer")
    published = api.catalog.flush()
    assert published is not None
    assert (batch_job, job.version) in published.changes
    [stored] = (await _get(api, batch_job)).resources
    assert stored.version == job.version
    assert (stored.policy.revision, job.policy.revision) == (api.catalog.revision, 1)
    stored.policy.revision = job.policy.revision  # the replica's count of flushes, not content
    assert stored.policy == job.policy
    assert api.health.rejections.items() == []


async def test_too_many_names_are_refused(api: Api) -> None:
    names = [f"slice/bookstore/s{i}|80" for i in range(10_001)]
    call = api.stub.GetResources(pb.GetResourcesRequest(names=names))
    await refused_on_the_wire(
        call, "GetResources", "names: 10001 names; at most 10000", api.health.rejections
    )
    answer = await api.stub.GetResources(pb.GetResourcesRequest(names=names[:10_000]))
    assert len(answer.missing) == 10_000


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
        (
            "GetResources",
            pb.GetResourcesRequest(names=["foo/bar"]),
            "names[0]: 'foo/bar' is not a policy/, slice/ or destination/ name",
        ),
        (
            "GetResources",
            pb.GetResourcesRequest(names=["slice/bookstore/bookstore-v1|14001", "policy/x"]),
            "names[1]: must be '<namespace>/",
        ),
        (  # a destination is a Service: "<namespace>/<name>" too
            "GetResources",
            pb.GetResourcesRequest(names=["destination/bookstore"]),
            "names[0]: must be '<namespace>/<name>', got 'bookstore'",
        ),
        (
            "GetResources",
            pb.GetResourcesRequest(
                names=["policy/bookbuyer/bookbuyer"],
                service_accounts={"bookbuyer/bookbuyer": "Bad Name!"},
            ),
            "service_accounts['bookbuyer/bookbuyer']: 'Bad Name!' is not a valid DNS-1123",
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


async def test_a_view_carries_only_the_endpoints_its_identity_may_reach(api: Api) -> None:
    two_accounts = replace(
        V1_MOVED,
        endpoints=(
            ProvidedEndpoint("10.0.0.9", (("http", 8081),), service_account="bookstore"),
            ProvidedEndpoint("10.0.0.8", (("http", 8081),), service_account="bookstore-canary"),
        ),
    )
    api.catalog.update_provider_service("vm", "bookstore", "bookstore-v1", two_accounts)
    api.catalog.flush()
    view = await api.stub.GetView(pb.GetViewRequest(identity=str(BUYER)))
    [cluster] = [c for c in view.clusters if c.name == "bookstore/bookstore-v1|14001"]
    # the example's TrafficTarget lets bookbuyer call the account bookstore only
    assert [e.address for e in cluster.endpoints] == ["10.0.0.9"]
    assert list(cluster.spiffe_ids) == ["spiffe://cluster.local/ns/bookstore/sa/bookstore"]
    assert cluster.slice == ""  # a whole view has its endpoints in place
    assert view.version == api.catalog.view_version(BUYER)
    # the same, as proxy-cp takes it: the policy names a slice limited to that account
    # ("" too: endpoints that name no account run as the service's own, bookstore)
    name = "slice/bookstore/bookstore-v1|14001@,bookstore"
    [policy] = (await _get(api, f"policy/{BUYER}")).resources
    [ref] = [c for c in policy.policy.clusters if c.name == "bookstore/bookstore-v1|14001"]
    assert ref.slice == name
    assert len(ref.endpoints) == 0
    [found] = (await _get(api, name)).resources
    assert found.version == api.catalog.resources.versions[name]
    assert (found.slice.cluster, list(found.slice.accounts)) == (
        "bookstore/bookstore-v1|14001",
        ["", "bookstore"],
    )
    assert [e.address for e in found.slice.endpoints] == ["10.0.0.9"]
    assert list(found.slice.spiffe_ids) == list(cluster.spiffe_ids)
    assert api.catalog.resources.concerned(name) == {BUYER}
    # the cluster itself keeps both, for views that may reach both
    state = api.catalog.clusters["bookstore/bookstore-v1|14001"]
    assert sorted(e.address for e in state.endpoints) == ["10.0.0.8", "10.0.0.9"]
    # to_proto (GetView's and /v1/views') assembles the same view from the policy
    assembled = to_proto(
        api.catalog.policies[BUYER], api.catalog.clusters, view.version, view.revision
    )
    assert assembled == view
