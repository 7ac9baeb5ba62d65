"""The catalog client: the one resource follower (ListChanges since a cursor, one
GetResources for what moved of what it holds) and the proxies it registers again when the
catalog may have lost them.

Most tests drive the follower as the signals hub does (``resync``, ``changed``) against a
catalog served over gRPC (:class:`~trellis_proxy_cp.testing.FakeCatalog`); the last one
runs the real hub on a real Redis, the catalog signalling ``views`` there.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache import inputs
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_runtime.events import Signals
from trellis_runtime.health import Health
from trellis_runtime.signaling import Event, Publisher
from trellis_testing import RedisServer, eventually

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


def signal(cursor: str) -> Event:
    return Event("views", "changed", cursor, 1, "catalog-0")


async def test_a_signal_refetches_only_the_wanted_identities_whose_version_moved(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await catalog.set_view(t.view(BUYER, "1"))
    wanted = await client.want(BOOKSTORE, "bookstore")
    assert [c.slice for c in wanted.policy.clusters] == ["slice/bookstore/reviews|9080"]
    assert [e.address for e in wanted.slices["slice/bookstore/reviews|9080"].endpoints] == [
        "10.0.0.1"
    ]
    await client.follower.resync("views")  # the first listing is full: nothing moved
    assert views.seen == []
    assert views.slices == []
    synced_at = client.cursor

    await catalog.set_view(other(BUYER))  # not wanted here
    await client.follower.changed(signal(await catalog.set_view(other(BOOKSTORE))))

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
    await client.follower.resync("views")
    await catalog.remove_view(BOOKSTORE)  # nothing declares it any more
    catalog.restart()  # and the catalog restarted: our cursor is of another epoch

    await client.follower.resync("views")

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
    await client.follower.resync("views")
    before = client.cursor
    await catalog.set_view(other(BOOKSTORE))
    catalog.failing = True

    with pytest.raises(Exception, match="UNAVAILABLE"):
        await client.follower.changed(signal(catalog.cursor))
    assert client.cursor == before

    catalog.failing = False
    await client.follower.resync("views")  # what the hub does after a failure
    assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]
    assert catalog.listings[-1] == before


async def test_connected_proxies_are_registered_again_after_a_catalog_restart(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.resync("views")
    await client.register(PROXY, "")
    assert catalog.registered == {PROXY: "proxy-cp-0"}
    catalog.restart()  # the new catalog knows nothing of the proxies connected here
    assert catalog.registered == {}

    await client.follower.changed(signal(await catalog.set_view(t.view(BOOKSTORE, "1"))))

    assert catalog.registered == {PROXY: "proxy-cp-0"}


async def test_a_registration_that_failed_is_sent_again_on_the_next_sync(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.resync("views")
    catalog.failing = True
    with pytest.raises(Exception, match="UNAVAILABLE"):
        await client.register(PROXY, "")
    catalog.failing = False
    gone = t.proxy_common_name("bookstore", "bookstore", 2)
    await client.register(gone, "")
    await client.unregister(gone)  # it left before the catalog was asked again

    await client.follower.changed(signal(await catalog.set_view(t.view(BOOKSTORE, "1"))))

    assert catalog.registered == {PROXY: "proxy-cp-0"}


async def test_after_the_signals_were_lost_the_proxies_are_registered_again(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.resync("views")
    await client.register(PROXY, "")
    catalog.registered.clear()  # as if the catalog lost them while we could not hear it

    client.follower.lost()
    await client.follower.resync("views")

    assert catalog.registered == {PROXY: "proxy-cp-0"}


async def test_views_flow_from_the_catalog_s_signal_over_redis(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    health = Health()
    publisher = Publisher(redis_client, sender="catalog-0")
    views = Views()
    async with t.fake_catalog({}, publisher) as catalog:
        await catalog.set_view(t.view(BOOKSTORE, "1"))
        client = CatalogClient(t.locator(catalog.address), views, "proxy-cp-0", health)
        await client.want(BOOKSTORE, "bookstore")
        signals = Signals(redis_server.url, health)
        signals.follow(client.follower)
        stop = asyncio.Event()
        hub = asyncio.create_task(signals.run(stop))
        try:
            await asyncio.wait_for(client.connected.wait(), 10)
            await catalog.set_view(other(BOOKSTORE))
            await asyncio.wait_for(views.changed.wait(), 10)
            await eventually(lambda: client.cursor == catalog.cursor)
            assert "catalog resources" not in health.loops.down()
        finally:
            stop.set()
            await hub
            await client.close()

    assert views.seen == [(BOOKSTORE, version_of(BOOKSTORE))]


async def test_replicas_follow_one_signal_each_fetching_only_what_it_serves(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    """Three proxy-cp replicas, each with proxies of its own identity: one change is one
    PUBLISH by the catalog, then per replica one ListChanges of what moved since its
    cursor and a GetResources only where that replica serves the identity."""
    publisher = Publisher(redis_client, sender="catalog-0")
    identities = [f"ns/svc-{i}" for i in range(3)]
    async with t.fake_catalog({}, publisher) as catalog:
        for identity in identities:
            await catalog.set_view(t.view(identity, "1"))
        replicas, hubs, stop = [], [], asyncio.Event()
        try:
            for i, identity in enumerate(identities):
                views = Views()
                client = CatalogClient(t.locator(catalog.address), views, f"proxy-cp-{i}")
                await client.want(identity, "sa")
                signals = Signals(redis_server.url, Health())
                signals.follow(client.follower)
                hubs.append(asyncio.create_task(signals.run(stop)))
                replicas.append((client, views))
            for client, _ in replicas:
                await asyncio.wait_for(client.connected.wait(), 10)
            listed, fetched = len(catalog.listings), catalog.view_calls.copy()

            await catalog.set_view(other("ns/svc-1"))  # one change: one signal

            for client, _ in replicas:
                await eventually(lambda c=client: c.cursor == catalog.cursor)  # type: ignore[misc]
            assert len(catalog.listings) - listed == 3  # one small listing per replica
            assert catalog.view_calls - fetched == {"ns/svc-1": 1}  # only its server fetched
            moved = [("ns/svc-1", version_of("ns/svc-1"))]
            assert [views.seen for _, views in replicas] == [[], moved, []]
        finally:
            stop.set()
            await asyncio.gather(*hubs)
            for client, _ in replicas:
                await client.close()


async def test_an_endpoint_change_fetches_the_slice_and_no_policy(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    await client.follower.resync("views")
    asked = len(catalog.gets)

    moved = t.view(BOOKSTORE, "1", endpoints=("10.0.0.9",))
    await client.follower.changed(signal(await catalog.set_view(moved)))

    assert views.seen == []  # the policy did not move
    assert views.slices == [("slice/bookstore/reviews|9080", "10.0.0.9")]
    assert catalog.gets[asked:] == [["slice/bookstore/reviews|9080"]]
    assert client.slices["slice/bookstore/reviews|9080"].endpoints[0].address == "10.0.0.9"


async def test_destinations_follow_the_same_listing_into_the_table(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await catalog.set_destination(pb.Destination(namespace="shop", name="store", version="1"))
    await catalog.set_destination(pb.Destination(namespace="shop", name="cart", version="1"))
    await client.follower.resync("views")
    assert sorted(client.table.by_name) == ["shop/cart", "shop/store"]

    await catalog.set_destination(pb.Destination(namespace="shop", name="store", version="2"))
    await client.follower.changed(signal(await catalog.remove_destination("shop/cart")))
    assert sorted(client.table.by_name) == ["shop/store"]
    store = client.table.get("shop/store")
    assert store is not None
    assert store.version == "2"
    assert catalog.gets[-1] == ["destination/shop/store"]  # the moved one only

    await catalog.remove_destination("shop/store")
    catalog.restart()  # a full listing without it: gone
    await client.follower.resync("views")
    assert client.table.by_name == {}


async def test_fresh_waits_for_a_listing_asked_after_it(
    catalog: t.FakeCatalog, client: CatalogClient
) -> None:
    await client.follower.resync("views")
    listed = len(catalog.listings)
    await catalog.set_destination(pb.Destination(namespace="shop", name="store", version="1"))

    await asyncio.gather(*(client.follower.fresh() for _ in range(3)))

    assert client.table.get("shop/store") is not None
    # the first lists; the two that came while it was in flight share the next one
    assert len(catalog.listings) - listed == 2
