"""What a Destination API caller may be told: only what its identity's view reaches.

Streams run over a real gRPC server (insecure: the caller comes from a fake ``identify``;
the real one, :class:`~trellis_proxy_cp.authorizer.MeshAuthorizer`, is driven with a fake
context where the certificate matters). The catalog's views and the table's listings are
the fakes of :mod:`trellis_proxy_cp.discovery.testing`; a new view reaches the server as the
catalog client's follower hands it on (``CallerViews.set``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, NoReturn, cast

import grpc
import pytest
from google.protobuf.message import Message
from prometheus_client import CollectorRegistry

from trellis_api import catalog_pb2 as cpb
from trellis_api.conduit.common import common_pb2 as conduit_common
from trellis_api.conduit.proxy.destination import destination_pb2_grpc as conduit_grpc
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import destination_pb2_grpc as dpb_grpc
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.authorizer import MeshAuthorizer
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_proxy_cp.clients.destinations import DestinationTable
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.discovery import testing as fake
from trellis_proxy_cp.discovery.access import (
    Access,
    Caller,
    CallerViews,
    Reach,
    Verdict,
    identified,
)
from trellis_proxy_cp.discovery.server import (
    CONDUIT_SERVICE,
    LINKERD_SERVICE,
    Discovery,
    DiscoveryMetrics,
    DiscoveryOptions,
    register,
)
from trellis_runtime.grpcserver import GrpcServer
from trellis_runtime.locate import OwnerUnavailable
from trellis_runtime.metrics import MetricFactory

CALLER = fake.CALLER
WEB = "web.shop.svc.cluster.local:80"
DB = "db.shop.svc.cluster.local:80"


def destination(name: str, endpoint: str, address: str, version: int = 1) -> cpb.Destination:
    """``shop/<name>``: port 80 with one endpoint at ``endpoint``:8080; ``address`` its
    clusterIP."""
    cluster = cpb.Cluster(
        name=f"shop/{name}|80",
        namespace="shop",
        service=name,
        port=80,
        protocol="http",
        mesh_tls=True,
        endpoints=[cpb.ClusterEndpoint(address=endpoint, port=8080, service_account=name)],
    )
    return cpb.Destination(
        namespace="shop",
        name=name,
        version=str(version),
        addresses=[address],
        ports=[cluster],
        trust_domain="cluster.local",
    )


@dataclass
class Served:
    table: DestinationTable
    catalog: fake.CatalogViews
    listings: fake.Listings
    access: Access
    registry: CollectorRegistry
    channel: grpc.aio.Channel

    def get(self, path: str) -> Any:
        return dpb_grpc.DestinationStub(self.channel).Get(dpb.GetDestination(path=path))

    def profile(self, path: str) -> Any:
        return dpb_grpc.DestinationStub(self.channel).GetProfile(dpb.GetDestination(path=path))

    def conduit(self, path: str) -> Any:
        stub = conduit_grpc.DestinationStub(self.channel)
        return stub.Get(conduit_common.Destination(scheme="k8s", path=path))

    def moved(self, *names: str) -> None:
        """The caller's policy changed: its view reaches ``names``, in the catalog, and the
        view follower hands the new view on."""
        view = self.catalog.views[CALLER.identity] = fake.view(*names)
        self.access.views.set(CALLER.identity, view)

    def refused(self, reason: str, code: str = "PERMISSION_DENIED") -> float:
        sample = self.registry.get_sample_value(
            "test_destination_refused_total", {"code": code, "reason": reason}
        )
        return sample or 0.0


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    table = DestinationTable()
    table.apply(
        [destination("web", "10.0.0.1", "10.96.0.1"), destination("db", "10.0.0.2", "10.96.0.2")],
        [],
    )
    catalog = fake.CatalogViews({CALLER.identity: fake.view("shop/web")})
    listings = fake.Listings()
    access = fake.access(catalog, listings=listings)
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(MetricFactory(registry, "test"))
    discovery = Discovery(table, DiscoveryOptions(), metrics, access)
    server = GrpcServer(
        "127.0.0.1:0", register(discovery), [LINKERD_SERVICE, CONDUIT_SERVICE], grace=0.1
    )
    stop = asyncio.Event()
    await server.start()
    running = asyncio.create_task(server.run(stop))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield Served(table, catalog, listings, access, registry, channel)
    stop.set()
    await running


async def read(call: Any) -> Any:
    """The next message of ``call``."""
    message = await asyncio.wait_for(call.read(), 5)
    assert isinstance(message, Message), message
    return message


async def ended(call: Any) -> grpc.aio.AioRpcError:
    """The error that ends ``call`` (it must end, not send)."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await read(call)
    return caught.value


def kind(update: Any) -> str:
    found = update.WhichOneof("update")
    if found == "no_endpoints":
        return f"no_endpoints({str(update.no_endpoints.exists).lower()})"
    return str(found)


# -- what a view reaches -------------------------------------------------------------------


def test_a_view_reaches_its_outbound_services_their_backends_and_its_service_entries() -> None:
    view = cpb.View(
        outbound=[cpb.OutboundService(namespace="shop", name="web", port=80)],
        clusters=[
            cpb.Cluster(name="shop/web-v2|80", namespace="shop", service="web-v2", port=80),
            cpb.Cluster(name="passthrough"),  # names no service
        ],
        external=[cpb.ExternalService(host="api.example.com", port=443, source="shop/payments")],
    )
    reach = Reach.of(view)
    assert reach.names == {"shop/web", "shop/web-v2", "shop/payments"}
    assert "shop/db" not in reach


def test_permissive_mode_takes_no_shortcut_the_view_lists_what_is_reachable() -> None:
    # the catalog lists every service exported to the caller's namespace in a permissive
    # view; one it leaves out (exported elsewhere only) stays out of reach
    reach = Reach.of(fake.view("shop/web", "shop/db", permissive=True))
    assert reach.names == {"shop/web", "shop/db"}
    assert "private/ledger" not in reach


# -- who asks ------------------------------------------------------------------------------


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class CertificateContext:
    """What grpc gives after an mTLS handshake, and an ``abort`` that raises as grpc's."""

    def __init__(self, common_name: str) -> None:
        pem = t.peer_certificate_pem(common_name, 0xC0FFEE, dt.timedelta(minutes=5))
        self._auth = {"x509_common_name": [common_name.encode()], "x509_pem_cert": [pem]}

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def peer(self) -> str:
        return "ipv4:127.0.0.1:4242"

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


def certificate_discovery(
    expected: dict[str, str], catalog: fake.CatalogViews, registry: CollectorRegistry
) -> Discovery:
    """A Discovery whose callers are identified by :class:`MeshAuthorizer` (the catalog
    expects ``expected``: common name -> service account)."""

    async def expectation(
        common_name: str, serial: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        account = expected.get(common_name)
        return Expectation(account, "c0ffee") if account is not None else None

    async def never(identity: str, account: str) -> Any:
        raise AssertionError("the Destination API attaches no proxy to the control plane")

    authorizer = MeshAuthorizer(ProxyControlPlane(SnapshotCache(), never, never), expectation)
    views = CallerViews(catalog.want, catalog.forget)
    access = Access(identified(authorizer.identify), views, fake.Listings())
    metrics = DiscoveryMetrics(MetricFactory(registry, "test"))
    return Discovery(DestinationTable(), DiscoveryOptions(), metrics, access)


def context(common_name: str) -> grpc.aio.ServicerContext[Any, Any]:
    return cast("grpc.aio.ServicerContext[Any, Any]", CertificateContext(common_name))


async def test_the_caller_is_the_identity_of_its_proxy_certificate() -> None:
    proxy = t.proxy_common_name("buyer", "shop", 1)
    discovery = certificate_discovery({proxy: "buyer-sa"}, fake.CatalogViews(), CollectorRegistry())
    caller, target = await discovery.admit(context(proxy), WEB)
    assert caller == Caller(proxy, "shop/buyer", "buyer-sa")
    assert (target.namespace, target.service, target.port) == ("shop", "web", 80)


async def test_a_proxy_the_catalog_does_not_expect_is_refused_before_any_view_is_asked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the catalog would answer GetView for any identity (deny by default, or everything in
    # permissive mode): the proxy itself must be known
    stranger = t.proxy_common_name("buyer", "shop", 9)
    catalog = fake.CatalogViews()
    registry = CollectorRegistry()
    discovery = certificate_discovery({}, catalog, registry)
    with caplog.at_level(logging.WARNING), pytest.raises(Aborted) as refused:
        await discovery.admit(context(stranger), WEB)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert f"proxy {stranger} is not expected" in str(refused.value)
    assert f"destination.refused peer={stranger} reason=not_expected" in caplog.text
    labels = {"code": "PERMISSION_DENIED", "reason": "not_expected"}
    assert registry.get_sample_value("test_destination_refused_total", labels) == 1
    assert catalog.asked == []


# -- what it may ask about -----------------------------------------------------------------


async def test_a_caller_is_answered_about_what_its_view_reaches(served: Served) -> None:
    [addr] = (await read(served.get(WEB))).add.addrs
    assert addr.addr.port == 8080
    profile = await read(served.profile(WEB))
    assert profile.fully_qualified_name == "web.shop.svc.cluster.local"
    assert (await read(served.conduit(WEB))).WhichOneof("update") == "add"
    # a name no destination owns tells nothing of anything: answered as ever
    assert (
        kind(await read(served.get("nothing.shop.svc.cluster.local:80"))) == "no_endpoints(false)"
    )
    assert served.catalog.asked == [CALLER.identity]  # once, for all its streams


async def test_a_destination_out_of_reach_is_refused_naming_the_caller_and_it(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        for call in (served.get(DB), served.profile(DB), served.conduit(DB)):
            error = await ended(call)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            details = error.details() or ""
            assert f"proxy {CALLER.common_name} (identity {CALLER.identity})" in details
            assert "may not reach shop/db" in details
    assert caplog.text.count("destination.refused") == 3
    assert "reason=not_reachable" in caplog.text
    assert served.refused("not_reachable") == 3


@pytest.mark.parametrize(
    ("path", "answered"),
    [
        ("10.96.0.1:80", True),  # web's clusterIP
        ("10.0.0.1:8080", True),  # web's endpoint
        ("10.96.0.2:80", False),  # db's clusterIP
        ("10.0.0.2:8080", False),  # db's endpoint
    ],
)
async def test_an_address_is_answered_only_if_its_destination_is_in_reach(
    served: Served, path: str, answered: bool
) -> None:
    # the APIs that answer addresses: GetProfile, and the conduit Get (the Linkerd Get
    # refuses them all, INVALID_ARGUMENT, as upstream's)
    profile, call = served.profile(path), served.conduit(path)
    if answered:
        assert kind(await read(call)) == "add"
        assert (await read(profile)).retry_budget.retry_ratio > 0
    else:
        for refused in (call, profile):
            error = await ended(refused)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "may not reach shop/db" in (error.details() or "")


async def test_an_address_no_destination_owns_is_answered_as_unknown(served: Served) -> None:
    assert kind(await read(served.conduit("10.9.9.9:80"))) == "no_endpoints(false)"
    assert not (await read(served.profile("10.9.9.9:80"))).fully_qualified_name
    assert served.refused("not_reachable") == 0


async def test_a_caller_whose_view_cannot_be_had_is_told_to_retry() -> None:
    class Down(fake.CatalogViews):
        async def want(self, identity: str, service_account: str) -> cpb.View:
            raise OwnerUnavailable("catalog")

    catalog = Down()
    table = DestinationTable()
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(MetricFactory(registry, "test"))
    discovery = Discovery(table, DiscoveryOptions(), metrics, fake.access(catalog))
    server = GrpcServer("127.0.0.1:0", register(discovery), [LINKERD_SERVICE], grace=0.1)
    stop = asyncio.Event()
    await server.start()
    running = asyncio.create_task(server.run(stop))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = dpb_grpc.DestinationStub(channel).Get(dpb.GetDestination(path=WEB))
        error = await ended(call)
    stop.set()
    await running
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert "retry later" in (error.details() or "")
    labels = {"code": "UNAVAILABLE", "reason": "catalog_unavailable"}
    assert registry.get_sample_value("test_destination_refused_total", labels) == 1
    assert catalog.forgotten == [CALLER.identity]


# -- when the view moves -------------------------------------------------------------------


async def test_a_stream_ends_when_the_view_stops_reaching_its_destination(served: Served) -> None:
    call = served.get(WEB)
    assert kind(await read(call)) == "add"
    served.moved()  # a policy change: web is out of reach
    error = await ended(call)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"{CALLER} may not reach shop/web" in (error.details() or "")
    assert "its access policy changed" in (error.details() or "")
    assert served.listings.asked == 1  # the table was brought up to date first
    assert served.refused("not_reachable") == 1
    # asked again: refused while the policy stands, answered once it lets the caller
    assert (await ended(served.get(WEB))).code() == grpc.StatusCode.PERMISSION_DENIED
    served.moved("shop/web")
    assert kind(await read(served.get(WEB))) == "add"


async def test_a_destination_that_goes_is_followed_as_gone_when_the_view_says_so_first(
    served: Served,
) -> None:
    call = served.get(WEB)
    assert kind(await read(call)) == "add"
    # web is deleted: the views lose it and so will the table, whose listing comes later
    served.listings.news.append(lambda: served.table.apply([], ["shop/web"]))
    served.moved()
    assert kind(await read(call)) == "no_endpoints(false)"
    assert served.listings.asked == 1
    assert served.refused("not_reachable") == 0
    # the same stream follows the name when it comes back
    served.table.apply([destination("web", "10.0.0.3", "10.96.0.1", version=2)], [])
    served.moved("shop/web")
    [addr] = (await read(call)).add.addrs
    assert addr.addr.port == 8080


async def test_a_destination_the_table_lists_before_the_view_waits_for_the_view(
    served: Served,
) -> None:
    call = served.get("new.shop.svc.cluster.local:80")
    assert kind(await read(call)) == "no_endpoints(false)"
    # the table hears of shop/new before the caller's view does: nothing is sent (the
    # next message is the view's add), and nothing is refused
    served.table.apply([destination("new", "10.0.0.4", "10.96.0.4")], [])
    served.moved("shop/web", "shop/new")
    assert kind(await read(call)) == "add"
    assert served.listings.asked == 0
    assert served.refused("not_reachable") == 0


async def test_an_address_that_moves_out_of_reach_is_answered_as_unknown_not_refused(
    served: Served,
) -> None:
    call = served.conduit("10.0.0.1:8080")
    assert kind(await read(call)) == "add"
    # the address is now db's endpoint: the table knows, the caller's view has not moved,
    # so nothing of db is sent, and only a newer view may end the stream
    served.table.apply(
        [
            destination("web", "10.0.0.5", "10.96.0.1", version=2),
            destination("db", "10.0.0.1", "10.96.0.2", version=2),
        ],
        [],
    )
    assert kind(await read(call)) == "no_endpoints(false)"
    served.moved("shop/web", "shop/db")
    [addr] = (await read(call)).add.addrs
    assert addr.metric_labels["serviceaccount"] == "db"
    assert served.refused("not_reachable") == 0


async def test_a_sight_refuses_at_open_waits_for_the_view_and_confirms_what_it_drops() -> None:
    catalog = fake.CatalogViews({CALLER.identity: fake.view("shop/web")})
    views = CallerViews(catalog.want, catalog.forget)
    async with views.following(CALLER, lambda: None) as opening:
        assert opening.verdict("shop/db") is Verdict.REFUSE  # at open: out of reach
    async with views.following(CALLER, lambda: None) as sight:
        assert sight.verdict("") is Verdict.ANSWER  # nothing owns it: nothing to hide
        assert sight.verdict("shop/web") is Verdict.ANSWER
        assert sight.verdict("shop/new") is Verdict.HIDE  # the table is ahead of the view
        views.set(CALLER.identity, fake.view("shop/web", "shop/new"))
        assert sight.verdict("shop/new") is Verdict.ANSWER
        views.set(CALLER.identity, fake.view("shop/web"))  # the view dropped it: gone, or denied?
        assert sight.verdict("shop/new") is Verdict.CONFIRM
        assert sight.verdict("shop/new", fresh=True) is Verdict.REFUSE  # still in the table
        assert sight.verdict("", fresh=True) is Verdict.ANSWER  # gone from the table too


async def test_views_are_asked_once_per_identity_and_forgotten_with_its_last_stream() -> None:
    catalog = fake.CatalogViews({CALLER.identity: fake.view("shop/web")})
    views = CallerViews(catalog.want, catalog.forget)
    woken: list[str] = []
    async with (
        views.following(CALLER, lambda: woken.append("a")) as a,
        views.following(CALLER, lambda: woken.append("b")) as b,
    ):
        assert catalog.asked == [CALLER.identity]
        assert CALLER.identity in views
        views.set(CALLER.identity, fake.view("shop/web"))  # endpoints moved: the same reach
        assert woken == []
        views.set(CALLER.identity, fake.view("shop/web", "shop/db"))
        assert sorted(woken) == ["a", "b"]
        assert "shop/db" in a.reach
        assert a.reach is b.reach
        views.set("shop/other", fake.view("shop/db", identity="shop/other"))  # not followed
    assert CALLER.identity not in views
    assert "shop/other" not in views
    assert catalog.forgotten == [CALLER.identity]


# -- the table, brought up to date ---------------------------------------------------------


class Listings:
    """The catalog's ``ListChanges``: counts its calls; while ``gate`` is unset they
    wait (``entered`` is set when one arrives)."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()

    async def ListChanges(
        self, request: cpb.ListChangesRequest, context: Any
    ) -> cpb.ListChangesResponse:
        self.calls += 1
        self.entered.set()
        await self.gate.wait()
        return cpb.ListChangesResponse(cursor=f"e-{self.calls}", full=True)

    def register(self, server: grpc.aio.Server) -> None:
        handler: grpc.RpcMethodHandler[Any, Any] = grpc.unary_unary_rpc_method_handler(
            self.ListChanges,
            request_deserializer=cpb.ListChangesRequest.FromString,
            response_serializer=lambda answer: answer.SerializeToString(),
        )
        service = cpb.DESCRIPTOR.services_by_name["Catalog"].full_name
        generic = grpc.method_handlers_generic_handler(service, {"ListChanges": handler})
        server.add_generic_rpc_handlers((generic,))


async def _nothing_handed_on(policies: object, slices: object) -> None:
    raise AssertionError("nothing to hand on: the listings are empty")


async def test_fresh_lists_once_for_every_caller_that_asked_during_a_listing() -> None:
    listings = Listings()
    server = grpc.aio.server()
    listings.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = CatalogClient(t.locator(f"127.0.0.1:{port}"), _nothing_handed_on)
    follower = client.follower
    try:
        await follower.fresh()  # nothing in flight: one listing
        assert listings.calls == 1
        listings.gate.clear()
        listings.entered.clear()
        signalled = asyncio.create_task(follower.sync())  # the hub's, on a signal
        await listings.entered.wait()
        asking: list[Awaitable[None]] = [asyncio.create_task(follower.fresh()) for _ in range(3)]
        await asyncio.sleep(0)  # let them ask (and queue) while the listing is in flight
        listings.gate.set()
        await asyncio.gather(signalled, *asking)
        # the one in flight started before they asked: one more, for all three
        assert listings.calls == 3
        assert client.cursor == "e-3"
    finally:
        listings.gate.set()
        await client.close()
        await server.stop(None)
