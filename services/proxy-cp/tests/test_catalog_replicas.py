"""proxy-cp's catalog follower between two real catalog replicas (active-active).

Each replica is the catalog's own :class:`~trellis_catalog.catalog.Catalog` behind its own
:class:`~trellis_catalog.transport.grpc_api.CatalogServicer` on a real grpc.aio server,
whose calls a server interceptor counts. The replicas are fed the same inputs in other
orders, so their cursors differ and their versions do not. The follower is driven one
listing at a time (``sync``, what each watch answer amounts to); the switch is its locator
finding the other replica (as it does when the first one stops answering).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.sources import kinds
from trellis_catalog.transport.grpc_api import CatalogServicer
from trellis_common.specdir import load_paths
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.clients.catalog import CatalogClient

ROOT = Path(__file__).resolve().parents[3]
PROXIES = [  # common name, service account
    ("6b1f3c1e-0000-4000-8000-000000000001.bookbuyer.bookbuyer", "bookbuyer"),
    ("6b1f3c1e-0000-4000-8000-000000000002.bookthief.bookthief", "bookthief"),
    ("6b1f3c1e-0000-4000-8000-000000000003.bookstore-v1.bookstore", "bookstore"),
    ("6b1f3c1e-0000-4000-8000-000000000004.bookstore-v2.bookstore", "bookstore"),
]
WANTED = {  # identity -> service account: the identities with proxies here
    "bookbuyer/bookbuyer": "bookbuyer",
    "bookthief/bookthief": "bookthief",
    "bookstore/bookstore-v1": "bookstore",
    "bookstore/bookstore-v2": "bookstore",
}


def _bookstore(name: str, address: str) -> ProvidedService:
    return ProvidedService(
        provider="vm",
        namespace="bookstore",
        name=name,
        ports=(("http", 14001, "", 0),),
        endpoints=(ProvidedEndpoint(address, (("http", 8080),), service_account="bookstore"),),
    )


BUYER = Identity("bookbuyer", "bookbuyer")
REPORTS = [_bookstore("bookstore-v1", "10.0.0.1"), _bookstore("bookstore-v2", "10.0.0.2")]
V2_MOVED = _bookstore("bookstore-v2", "10.0.0.9")


def _catalog(seed: int | None) -> Catalog:
    """A replica fed the bookstore: in one go (no seed), or in a shuffled order, in pieces."""
    documents, errors = load_paths([ROOT / "examples" / "bookstore"], kinds())
    assert errors == []
    catalog = Catalog()
    proxies, reports = list(PROXIES), list(REPORTS)
    if seed is not None:
        shuffle = random.Random(seed)
        shuffle.shuffle(proxies)
        shuffle.shuffle(reports)
        shuffle.shuffle(documents)
    for common_name, account in proxies:
        catalog.expect_proxy(common_name, account)
        if seed is not None:
            catalog.flush()
    catalog.set_documents(documents, errors)
    for report in reports:
        catalog.update_provider_service("vm", report.namespace, report.name, report)
        if seed is not None:
            catalog.flush()
    catalog.flush()
    return catalog


class Calls(grpc.aio.ServerInterceptor):
    """Counts the calls a server takes, by method name."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        self.counts[details.method.rpartition("/")[2]] += 1
        return await continuation(details)


@dataclass
class Replica:
    catalog: Catalog
    calls: Calls
    address: str


@asynccontextmanager
async def replica(seed: int | None) -> AsyncIterator[Replica]:
    calls = Calls()
    server = grpc.aio.server(interceptors=[calls])
    catalog = _catalog(seed)
    pb_grpc.add_CatalogServicer_to_server(CatalogServicer(catalog), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Replica(catalog, calls, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


class Views:
    """What the follower handed on (what proxy-cp would rebuild and push): policies as
    (identity, version), slices as (name, version; "" when gone), in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.slices: list[tuple[str, str]] = []

    async def __call__(
        self, policies: dict[str, pb.View], slices: dict[str, pb.ClusterSlice | None]
    ) -> None:
        self.seen += [(identity, policy.version) for identity, policy in policies.items()]
        self.slices += [(n, s.version if s is not None else "") for n, s in slices.items()]


@dataclass
class Setup:
    a: Replica
    b: Replica
    client: CatalogClient
    views: Views


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(replica(None))
        b = await stack.enter_async_context(replica(seed=7))
        views = Views()
        client = CatalogClient(t.locator(a.address), views, "proxy-cp-0")
        stack.push_async_callback(client.close)
        for identity, account in WANTED.items():
            await client.want(identity, account)
        await client.register(PROXIES[0][0], "10.0.1.1")
        await client.follower.sync()
        # the first (full) listing: nothing moved since the fetches
        assert views.seen == []
        assert views.slices == []
        yield Setup(a, b, client, views)


async def switch(client: CatalogClient, to: Replica) -> None:
    """The locator now finds ``to`` (the replica it had stopped answering)."""
    await client.locator.close()
    client.locator = t.locator(to.address)


def v2_slices(client: CatalogClient) -> list[str]:
    """The slices of bookstore-v2's cluster that the wanted identities' policies name."""
    return sorted(n for n in client.slices if "/bookstore-v2|" in n)


async def test_the_replicas_give_the_same_versions_under_their_own_cursors(setup: Setup) -> None:
    a, b = setup.a.catalog, setup.b.catalog
    assert a.resources.versions == b.resources.versions
    assert a.view_versions() == b.view_versions()
    assert a.changes_since("")[0] != b.changes_since("")[0]
    # a cursor of one replica is foreign to the other: a full listing
    assert b.changes_since(a.changes_since("")[0])[1]


async def test_switching_replica_fetches_and_pushes_nothing_when_nothing_changed(
    setup: Setup,
) -> None:
    client, b = setup.client, setup.b
    await switch(client, b)

    await client.follower.sync()  # after the reconnect, with replica A's cursor

    assert b.calls.counts["ListChanges"] == 1
    assert b.calls.counts["GetResources"] == 0
    assert setup.views.seen == []
    assert setup.views.slices == []
    assert client.cursor == b.catalog.changes_since("")[0]
    # the new replica learned which proxies are connected here
    assert b.catalog.proxies[PROXIES[0][0]].connected


async def test_after_a_switch_only_the_changed_slice_is_fetched_once(setup: Setup) -> None:
    client, a, b = setup.client, setup.a, setup.b
    await switch(client, b)
    await client.follower.sync()
    fetched_from_a = a.calls.counts["GetResources"]
    policies = {n: v for n, v in b.catalog.resources.versions.items() if n.startswith("policy/")}

    b.catalog.update_provider_service("vm", "bookstore", "bookstore-v2", V2_MOVED)
    await b.catalog.flush_and_announce()
    await client.follower.sync()  # B's flush
    a.catalog.update_provider_service("vm", "bookstore", "bookstore-v2", V2_MOVED)
    await a.catalog.flush_and_announce()
    await client.follower.sync()  # A's, the same change

    # an endpoint moved: its slice moves, no policy does
    assert {n: v for n, v in b.catalog.resources.versions.items() if n.startswith("policy/")} == (
        policies
    )
    moved = v2_slices(client)
    assert moved  # bookbuyer reaches v2
    assert b.calls.counts["GetResources"] == 1
    assert setup.views.seen == []
    assert setup.views.slices == [(n, b.catalog.resources.versions[n]) for n in moved]
    assert a.catalog.resources.versions == b.catalog.resources.versions
    assert a.calls.counts["GetResources"] == fetched_from_a  # A's announce was no work at all


async def test_a_lagging_replica_flaps_a_slice_for_one_of_its_flushes(setup: Setup) -> None:
    """The accepted rule (the catalog's docstring): versions carry no order, so proxy-cp
    switched to a replica that has not yet applied a change takes its older resource, and
    the newer one at that replica's next flush, which rings the bell again."""
    client, a, b = setup.client, setup.a, setup.b
    [name] = v2_slices(client)
    old = a.catalog.resources.versions[name]
    a.catalog.update_provider_service("vm", "bookstore", "bookstore-v2", V2_MOVED)
    await a.catalog.flush_and_announce()
    await client.follower.sync()
    new = a.catalog.resources.versions[name]
    await switch(client, b)  # B has not heard of the change yet

    await client.follower.sync()
    b.catalog.update_provider_service("vm", "bookstore", "bookstore-v2", V2_MOVED)
    await b.catalog.flush_and_announce()
    await client.follower.sync()

    assert setup.views.slices == [
        (name, new),  # from A
        (name, old),  # from B, lagging: the flap
        (name, new),  # B's next flush: the same version as A's
    ]
    assert client.version(name) == new
