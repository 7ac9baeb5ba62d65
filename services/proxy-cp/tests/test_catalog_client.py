"""The catalog client: the one resource follower (what moved since a cursor, one
GetResources for what moved of what it holds and did not come inline) and the proxies it
registers again when the catalog may have lost them.

Most tests drive one listing at a time (``sync``: ListChanges) against a catalog served
over gRPC (:class:`~trellis_proxy_cp.testing.FakeCatalog`); the ``watch`` tests run the
follower as proxy-cp does, on the ``WatchChanges`` stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache import inputs
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_runtime.health import Health
from trellis_testing import eventually

BOOKSTORE = "bookstore/bookstore"
BUYER = "bookbuyer/bookbuyer"
PROXY = t.proxy_common_name("bookstore", "bookstore")


class Views:
    """What the client handed on: (identity, policy version) and (slice name, its first
    endpoint's address, "" when gone) in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.slices: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    async def __call__(
        self, policies: dict[str, pb.View], slices: dict[str, pb.ClusterSlice | None]
    ) -> None:
        self.seen += [(identity, policy.version) for identity, policy in policies.items()]
        self.slices += [
            (name, found.endpoints[0].address if found is not None and found.endpoints else "")
            for name, found in slices.items()
        ]
        self.changed.set()


def other(identity: str) -> pb.View:
    """A view of ``identity`` whose policy differs from :func:`t.view`'s: another upstream."""
    return t.view(identity, "2", upstream="bookstore/ratings")


def version_of(identity: str) -> str:
    return inputs.split(other(identity)).policy.version


@pytest.fixture
async def catalog() -> AsyncIterator[t.FakeCatalog]:
    async with t.fake_catalog({PROXY: "bookstore"}) as served:
        yield served


@pytest.fixture
def views() -> Views:
    return Views()


@pytest.fixture
async def client(catalog: t.FakeCatalog, views: Views) -> AsyncIterator[CatalogClient]:
    made = CatalogClient(t.locator(catalog.address), views, "proxy-cp-0")
    try:
        yield made
    finally:
        await made.close()


async def test_a_listing_refetches_only_the_wanted_identities_whose_version_moved(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await catalog.set_view(t.view(BUYER, "1"))
    wanted = await client.want(BOOKSTORE, "bookstore")
    assert [c.slice for c in wanted.policy.clusters] == ["slice/bookstore/reviews|9080"]
    assert [e.address for e in wanted.slices["slice/bookstore/reviews|9080"].endpoints] == [
        "10.0.0.1"
    ]
    await client.follower.sync()  # the first listing is full: nothing moved
    assert views.seen == []
    assert views.slices == []
    synced_at = client.cursor

    await catalog.set_view(other(BUYER))  # not wanted here
    await catalog.set_view(other(BOOKSTORE))
    await client.follower.sync()

    assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]
    # the old upstream's slice is gone (no view names it), the new one's came in the same
    # round, asked for once
    assert views.slices == [
        ("slice/bookstore/reviews|9080", ""),
        ("slice/bookstore/ratings|9080", "10.0.0.1"),
    ]
    assert catalog.view_calls == {BOOKSTORE: 2}
    assert catalog.gets[-2:] == [
        ["policy/" + BOOKSTORE, "slice/bookstore/reviews|9080"],
        ["slice/bookstore/ratings|9080"],
    ]
    assert client.cursor == catalog.cursor
    assert catalog.listings == ["", synced_at]


async def test_a_wanted_identity_missing_from_a_full_listing_is_refetched(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    await client.follower.sync()
    await catalog.remove_view(BOOKSTORE)  # nothing declares it any more
    catalog.restart()  # and the catalog restarted: our cursor is of another epoch

    await client.follower.sync()

    # its policy now, as the catalog computes one on demand (nothing reachable); its old
    # upstream's slice is gone (missing from the full listing, and then from the catalog)
    empty = inputs.split(pb.View(identity=BOOKSTORE)).policy
    assert views.seen == [(BOOKSTORE, empty.version)]
    assert views.slices == [("slice/bookstore/reviews|9080", "")]
    assert client.slices == {}
    assert client.cursor == catalog.cursor


async def test_a_failed_refetch_keeps_the_cursor_so_the_next_sync_misses_nothing(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    await client.follower.sync()
    before = client.cursor
    await catalog.set_view(other(BOOKSTORE))
    catalog.failing = True

    with pytest.raises(Exception, match="UNAVAILABLE"):
        await client.follower.sync()
    assert client.cursor == before

    catalog.failing = False
    await client.follower.sync()  # what the hub does after a failure
    assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]
    assert catalog.listings[-1] == before


async def test_connected_proxies_are_registered_again_after_a_catalog_restart(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.sync()
    await client.register(PROXY, "")
    assert catalog.registered == {PROXY: "proxy-cp-0"}
    catalog.restart()  # the new catalog knows nothing of the proxies connected here
    assert catalog.registered == {}

    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.follower.sync()

    assert catalog.registered == {PROXY: "proxy-cp-0"}


async def test_a_registration_that_failed_is_sent_again_on_the_next_sync(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.sync()
    catalog.failing = True
    with pytest.raises(Exception, match="UNAVAILABLE"):
        await client.register(PROXY, "")
    catalog.failing = False
    gone = t.proxy_common_name("bookstore", "bookstore", 2)
    await client.register(gone, "")
    await client.unregister(gone)  # it left before the catalog was asked again

    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.follower.sync()

    assert catalog.registered == {PROXY: "proxy-cp-0"}


async def test_after_the_watch_was_lost_the_proxies_are_registered_again(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.sync()
    await client.register(PROXY, "")
    catalog.registered.clear()  # as if the catalog lost them while we could not hear it

    client.follower.lost()
    await client.follower.sync()

    assert catalog.registered == {PROXY: "proxy-cp-0"}


@contextlib.asynccontextmanager
async def watching(client: CatalogClient) -> AsyncIterator[asyncio.Event]:
    """``client``'s follower running as proxy-cp runs it, until the block ends."""
    stop = asyncio.Event()
    task = asyncio.create_task(client.follower.run(stop))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_watch_an_endpoint_change_arrives_inline_and_nothing_is_fetched(
    catalog: t.FakeCatalog, views: Views
) -> None:
    health = Health()
    client = CatalogClient(t.locator(catalog.address), views, "proxy-cp-0", health)
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    async with watching(client):
        await asyncio.wait_for(client.connected.wait(), 10)
        assert "catalog resources" not in health.loops.down()
        asked, listed = len(catalog.gets), len(catalog.listings)

        await catalog.set_view(t.view(BOOKSTORE, "1", endpoints=("10.0.0.9",)))

        await eventually(lambda: client.cursor == catalog.cursor)
        assert views.slices == [("slice/bookstore/reviews|9080", "10.0.0.9")]
        assert len(catalog.gets) == asked  # it came with the watch answer
        assert len(catalog.listings) == listed  # and no ListChanges was asked
        await catalog.set_view(other(BOOKSTORE))  # a policy is fetched, as before
        await eventually(lambda: views.seen == [(BOOKSTORE, version_of(BOOKSTORE))])
        # its new slice came inline; the old one is asked for (a policy computed on demand
        # may still name a slice no stored policy does)
        assert catalog.gets[-1] == ["policy/" + BOOKSTORE, "slice/bookstore/reviews|9080"]
    await client.close()
    assert catalog.watches == 1


async def test_watch_a_lost_stream_is_down_then_opened_again_from_the_cursor(
    catalog: t.FakeCatalog, views: Views
) -> None:
    """A catalog restart ends the stream: the loop is down, readiness with it, and the
    next stream (from our cursor, another epoch's: a full listing) registers the proxies
    connected here again and takes what moved meanwhile."""
    health = Health()
    client = CatalogClient(t.locator(catalog.address), views, "proxy-cp-0", health)
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    async with watching(client):
        await asyncio.wait_for(client.connected.wait(), 10)
        await client.register(PROXY, "")
        catalog.failing = True
        catalog.restart()  # the stream ends; the catalog forgot the proxies

        await eventually(lambda: "catalog resources" in health.loops.down())
        assert not client.connected.is_set()
        await catalog.set_view(other(BOOKSTORE))  # a change made while we cannot hear it
        catalog.failing = False

        await eventually(lambda: client.cursor == catalog.cursor, timeout=15)
        await asyncio.wait_for(client.connected.wait(), 10)
        assert "catalog resources" not in health.loops.down()
        assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]
        assert catalog.registered == {PROXY: "proxy-cp-0"}
    await client.close()
    assert catalog.watches >= 2


async def test_watch_an_answer_overtaken_by_a_fresh_listing_is_not_applied(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    """fresh() lists on its own; a watch answer from before that listing holds nothing
    newer, and applying it could hand older resources on."""
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    await client.follower.sync()
    stale = pb.ListChangesResponse(
        cursor=client.cursor,
        changes=[pb.ResourceVersion(name="policy/" + BOOKSTORE, version="old")],
    )
    await catalog.set_view(other(BOOKSTORE))
    await client.follower.fresh()
    assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]
    asked = len(catalog.gets)

    await client.follower.apply(stale)

    assert len(catalog.gets) == asked
    assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]


async def test_replicas_each_watch_and_fetch_only_what_they_serve() -> None:
    """Three proxy-cp replicas, each with proxies of its own identity: one change is one
    watch answer per replica, no ListChanges, and a GetResources only where that replica
    serves the identity."""
    identities = [f"ns/svc-{i}" for i in range(3)]
    async with t.fake_catalog({}) as catalog, contextlib.AsyncExitStack() as running:
        for identity in identities:
            await catalog.set_view(t.view(identity, "1"))
        replicas = []
        for i, identity in enumerate(identities):
            views = Views()
            client = CatalogClient(t.locator(catalog.address), views, f"proxy-cp-{i}")
            running.push_async_callback(client.close)
            await client.want(identity, "sa")
            await running.enter_async_context(watching(client))
            replicas.append((client, views))
        for client, _ in replicas:
            await asyncio.wait_for(client.connected.wait(), 10)
        fetched = catalog.view_calls.copy()

        await catalog.set_view(other("ns/svc-1"))  # one change

        for client, _ in replicas:
            await eventually(lambda c=client: c.cursor == catalog.cursor)  # type: ignore[misc]
        assert catalog.listings == []  # every listing came on the watches
        assert catalog.view_calls - fetched == {"ns/svc-1": 1}  # only its server fetched
        moved = [("ns/svc-1", version_of("ns/svc-1"))]
        assert [views.seen for _, views in replicas] == [[], moved, []]


async def test_an_endpoint_change_fetches_the_slice_and_no_policy(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    await client.follower.sync()
    asked = len(catalog.gets)

    moved = t.view(BOOKSTORE, "1", endpoints=("10.0.0.9",))
    await catalog.set_view(moved)
    await client.follower.sync()

    assert views.seen == []  # the policy did not move
    assert views.slices == [("slice/bookstore/reviews|9080", "10.0.0.9")]
    assert catalog.gets[asked:] == [["slice/bookstore/reviews|9080"]]
    assert client.slices["slice/bookstore/reviews|9080"].endpoints[0].address == "10.0.0.9"


async def test_destinations_follow_the_same_listing_into_the_table(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await catalog.set_destination(pb.Destination(namespace="shop", name="store", version="1"))
    await catalog.set_destination(pb.Destination(namespace="shop", name="cart", version="1"))
    await client.follower.sync()
    assert sorted(client.table.by_name) == ["shop/cart", "shop/store"]

    await catalog.set_destination(pb.Destination(namespace="shop", name="store", version="2"))
    await catalog.remove_destination("shop/cart")
    await client.follower.sync()
    assert sorted(client.table.by_name) == ["shop/store"]
    store = client.table.get("shop/store")
    assert store is not None
    assert store.version == "2"
    assert catalog.gets[-1] == ["destination/shop/store"]  # the moved one only

    await catalog.remove_destination("shop/store")
    catalog.restart()  # a full listing without it: gone
    await client.follower.sync()
    assert client.table.by_name == {}


async def test_fresh_waits_for_a_listing_asked_after_it(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.sync()
    listed = len(catalog.listings)
    await catalog.set_destination(pb.Destination(namespace="shop", name="store", version="1"))

    await asyncio.gather(*(client.follower.fresh() for _ in range(3)))

    assert client.table.get("shop/store") is not None
    # the first lists; the two that came while it was in flight share the next one
    assert len(catalog.listings) - listed == 2
