"""The catalog client: the ``views`` follower (ListViewVersions since a cursor, GetView for
what moved) and the proxies it registers again when the catalog may have lost them.

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
from trellis_common.events import Signals
from trellis_common.health import Health
from trellis_common.signaling import Event, Publisher
from trellis_common.testing import RedisServer, eventually
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.clients.catalog import CatalogClient

BOOKSTORE = "bookstore/bookstore"
BUYER = "bookbuyer/bookbuyer"
PROXY = t.proxy_common_name("bookstore", "bookstore")


class Views:
    """What the client handed on: (identity, version) in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.changed = asyncio.Event()

    async def __call__(self, identity: str, view: pb.View) -> None:
        self.seen.append((identity, view.version))
        self.changed.set()


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
    assert (await client.want(BOOKSTORE, "bookstore")).version == "1"
    await client.follower.resync("views")  # the first listing is full: nothing moved
    assert views.seen == []
    synced_at = client.cursor

    await catalog.set_view(t.view(BUYER, "2"))  # not wanted here
    await client.follower.changed(signal(await catalog.set_view(t.view(BOOKSTORE, "2"))))

    assert views.seen == [(BOOKSTORE, "2")]
    assert catalog.view_calls == {BOOKSTORE: 2}
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

    assert views.seen == [(BOOKSTORE, "")]  # its view now, as the catalog answers it
    assert client.cursor == catalog.cursor


async def test_a_failed_refetch_keeps_the_cursor_so_the_next_sync_misses_nothing(
    catalog: t.FakeCatalog, client: CatalogClient, views: Views
) -> None:
    await catalog.set_view(t.view(BOOKSTORE, "1"))
    await client.want(BOOKSTORE, "bookstore")
    await client.follower.resync("views")
    before = client.cursor
    await catalog.set_view(t.view(BOOKSTORE, "2"))
    catalog.failing = True

    with pytest.raises(Exception, match="UNAVAILABLE"):
        await client.follower.changed(signal(catalog.cursor))
    assert client.cursor == before

    catalog.failing = False
    await client.follower.resync("views")  # what the hub does after a failure
    assert views.seen == [(BOOKSTORE, "2")]
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
            await catalog.set_view(t.view(BOOKSTORE, "2"))
            await asyncio.wait_for(views.changed.wait(), 10)
            await eventually(lambda: client.cursor == catalog.cursor)
            assert "catalog views" not in health.loops.down()
        finally:
            stop.set()
            await hub
            await client.close()

    assert views.seen == [(BOOKSTORE, "2")]


async def test_replicas_follow_one_signal_each_fetching_only_what_it_serves(
    redis_server: RedisServer, redis_client: redis.asyncio.Redis
) -> None:
    """Three proxy-cp replicas, each with proxies of its own identity: one change is one
    PUBLISH by the catalog, then per replica one ListViewVersions of what moved since its
    cursor and a GetView only where that replica serves the identity."""
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

            await catalog.set_view(t.view("ns/svc-1", "2"))  # one change: one signal

            for client, _ in replicas:
                await eventually(lambda c=client: c.cursor == catalog.cursor)  # type: ignore[misc]
            assert len(catalog.listings) - listed == 3  # one small listing per replica
            assert catalog.view_calls - fetched == {"ns/svc-1": 1}  # only its server fetched
            assert [views.seen for _, views in replicas] == [[], [("ns/svc-1", "2")], []]
        finally:
            stop.set()
            await asyncio.gather(*hubs)
            for client, _ in replicas:
                await client.close()
