"""proxy-cp's side of the catalog: views of the identities that have proxies connected.

Views travel the one event path (``docs/architecture.md``): the catalog signals ``views``
(kind ``changed``, key: its cursor after the flush) and :class:`ViewFollower` asks
``ListViewVersions(since=<our cursor>)`` what moved, then refetches ``GetView`` for each
wanted identity whose version moved. A listing that is ``full`` (the first one, or a
catalog that restarted: a cursor from another epoch) lists every identity; a wanted
identity missing from it is refetched too (it may have become unknown, which still has an
outbound view). The cursor is stored only once every refetch succeeded, so a failed fetch
(the hub resyncs later, with backoff) misses nothing.

The catalog may run as several replicas (active-active). A view's version is a digest of its
content, the same from every replica, while a cursor is one replica's own: after the
channel finds another replica, our cursor is foreign there and the listing is full, and the
follower refetches only the wanted identities whose version differs from the one it holds
(none, if nothing changed), so nothing unchanged is handed on or pushed again. Each replica
announces each change: the second announce lists nothing new. A replica that has not yet
applied a change may hand us an older view after a switch; its next flush announces, and
we take the newer one (the catalog's module docstring states that rule).

A :class:`CatalogClient` also answers the questions a stream asks when it opens: is this
proxy expected (``ListProxies``, shared by many streams: :mod:`.expected`), and what is its
view. And it tells the catalog which proxies are connected here (``RegisterProxy``). The
catalog keeps that in memory only, so the follower registers every connected proxy again
whenever the catalog may have lost it: after a full listing (a new catalog), after the
signals were lost, and after a registration that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_common.events import Follower
from trellis_common.health import Health
from trellis_common.locate import Locator, OwnerUnavailable
from trellis_common.signaling import Event
from trellis_proxy_cp.clients import owners
from trellis_proxy_cp.clients.expected import Expectation, ExpectationTiming, ExpectedProxies

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The catalog's topic (its owner's ``TOPIC``).
TOPIC = "views"
#: Registrations in flight at once when every connected proxy is registered again.
REREGISTER_CONCURRENCY = 32

OnView = Callable[[str, pb.View], Awaitable[None]]


class CatalogClient:
    def __init__(
        self,
        locator: Locator,
        on_view: OnView,
        proxy_cp_name: str = "proxy-cp",
        health: Health | None = None,
        expectation: ExpectationTiming | None = None,
    ) -> None:
        self.locator = locator
        self.health = health if health is not None else Health()
        self._on_view = on_view
        self._name = proxy_cp_name
        self.wanted: dict[str, str] = {}  # identity -> service account
        self.versions: dict[str, str] = {}
        self.cursor = ""  # of the last listing whose changes were all fetched
        self.proxies: dict[str, str] = {}  # connected here: common name -> address
        self.expectations = ExpectedProxies(self._list_expected, expectation)
        self.follower = ViewFollower(self)

    @property
    def connected(self) -> asyncio.Event:
        """Set while the views are in sync with the catalog."""
        return self.follower.synced

    async def close(self) -> None:
        """Close the channel (a service's runtime closes its locators itself)."""
        await self.locator.close()

    async def _call(self, rpc: Callable[[pb_grpc.CatalogAsyncStub], Awaitable[T]]) -> T:
        return await owners.call(self.locator, lambda channel: rpc(pb_grpc.CatalogStub(channel)))

    # -- proxies ---------------------------------------------------------------------

    async def expected(
        self, common_name: str, serial: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        """What the catalog expects of a proxy presenting ``serial``, or None; raises
        :class:`~.expected.ExpectationUnknown` if the catalog cannot be asked.
        ``onboarding``: its certificate was just issued (see :class:`.ExpectedProxies`)."""
        return await self.expectations.account(common_name, serial, onboarding=onboarding)

    async def _list_expected(self) -> dict[str, Expectation | str]:
        listed = await self._call(
            lambda stub: stub.ListProxies(pb.ListProxiesRequest(), timeout=10)
        )
        return {
            p.common_name: Expectation(p.service_account, p.serial)
            for p in listed.proxies
            if p.expected
        }

    async def register(self, common_name: str, address: str) -> None:
        """Tell the catalog ``common_name`` is connected here (again after a failure, see
        the module docstring)."""
        self.proxies[common_name] = address
        try:
            await self._send_registration(common_name, address)
        except Exception:
            self.follower.reregister = True
            raise

    async def _send_registration(self, common_name: str, address: str) -> None:
        request = pb.RegisterProxyRequest(
            common_name=common_name, proxy_cp=self._name, address=address
        )
        await self._call(lambda stub: stub.RegisterProxy(request, timeout=10))

    async def expect(self, common_name: str, service_account: str) -> None:
        """Tell the catalog a proxy was just enrolled (as the injector does at onboarding)."""
        request = pb.ExpectProxyRequest(common_name=common_name, service_account=service_account)
        await self._call(lambda stub: stub.ExpectProxy(request, timeout=10))

    async def unregister(self, common_name: str) -> None:
        self.proxies.pop(common_name, None)
        request = pb.UnregisterProxyRequest(common_name=common_name)
        with contextlib.suppress(grpc.aio.AioRpcError, OwnerUnavailable):
            await self._call(lambda stub: stub.UnregisterProxy(request, timeout=10))

    async def reregister(self) -> None:
        """Register every proxy connected here; raises if the catalog did not take one."""
        limit = asyncio.Semaphore(REREGISTER_CONCURRENCY)

        async def one(common_name: str, address: str) -> None:
            async with limit:
                if self.proxies.get(common_name) == address:  # not gone meanwhile
                    await self._send_registration(common_name, address)

        await asyncio.gather(*(one(cn, address) for cn, address in list(self.proxies.items())))
        if self.proxies:
            log.info("catalog.proxies_registered count=%d", len(self.proxies))

    # -- views -----------------------------------------------------------------------

    async def view(self, identity: str, service_account: str = "") -> pb.View:
        request = pb.GetViewRequest(identity=identity, service_account=service_account)
        view = await self._call(lambda stub: stub.GetView(request, timeout=10))
        self.versions[identity] = view.version
        return view

    async def want(self, identity: str, service_account: str) -> pb.View:
        self.wanted[identity] = service_account
        return await self.view(identity, service_account)

    def forget(self, identity: str) -> None:
        self.wanted.pop(identity, None)
        self.versions.pop(identity, None)

    async def list_versions(self) -> pb.ListViewVersionsResponse:
        request = pb.ListViewVersionsRequest(since=self.cursor)
        return await self._call(lambda stub: stub.ListViewVersions(request, timeout=10))

    async def refresh(self, identity: str) -> None:
        """Refetch a wanted identity's view and hand it on (an RPC error is raised)."""
        account = self.wanted.get(identity)
        if account is None:
            return
        view = await self.view(identity, account)
        await self.health.rejections.guarded(
            "catalog view", identity, self._on_view(identity, view)
        )


class ViewFollower(Follower):
    """The ``views`` topic: list what moved since our cursor, refetch what we want."""

    topics = (TOPIC,)

    def __init__(self, client: CatalogClient) -> None:
        super().__init__("catalog views")
        self.client = client
        self.reregister = False  # the catalog may have lost the proxies connected here

    async def resync(self, topic: str) -> None:
        await self.sync()

    async def changed(self, event: Event) -> None:
        await self.sync()

    def lost(self) -> None:
        self.reregister = True

    async def sync(self) -> None:
        client = self.client
        listed = await client.list_versions()
        moved = {
            item.identity: item.version
            for item in listed.identities
            if item.identity in client.wanted and item.version != client.versions.get(item.identity)
        }
        if listed.full:
            listed_names = {item.identity for item in listed.identities}
            moved.update((i, "") for i in client.wanted if i not in listed_names)
        for identity in moved:
            await client.refresh(identity)
        client.cursor = listed.cursor
        if listed.full or self.reregister:
            self.reregister = False
            try:
                await client.reregister()
            except BaseException:
                self.reregister = True
                raise
        log.debug(
            "catalog.synced cursor=%s full=%s refetched=%d", listed.cursor, listed.full, len(moved)
        )
