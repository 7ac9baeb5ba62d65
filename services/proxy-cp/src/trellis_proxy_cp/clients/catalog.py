"""proxy-cp's side of the catalog: views of the identities that have proxies connected.

A :class:`CatalogClient` follows ``WatchViews``: when an identity with connected proxies
changes version, it fetches the new view and hands it on. It also answers the
questions a stream asks when it opens: is this proxy expected (from ``ListProxies``, shared
by many streams: :mod:`.expected`), and what is its view. The
stream is reopened with backoff when it breaks; after reopening, every wanted identity is
fetched again (nothing that happened in between is missed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, Awaitable, Callable

import grpc

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_common.follow import StreamFollower, describe
from trellis_common.health import Health
from trellis_proxy_cp.clients.expected import ExpectationTiming, ExpectedProxies

log = logging.getLogger(__name__)

OnView = Callable[[str, pb.View], Awaitable[None]]


class CatalogClient:
    def __init__(
        self,
        address: str,
        on_view: OnView,
        proxy_cp_name: str = "proxy-cp",
        health: Health | None = None,
        expectation: ExpectationTiming | None = None,
    ) -> None:
        self.address = address
        self.health = health if health is not None else Health()
        self.loops = self.health.loops
        self._on_view = on_view
        self._name = proxy_cp_name
        self._channel = grpc.aio.insecure_channel(address)
        self._stub: pb_grpc.CatalogAsyncStub = pb_grpc.CatalogStub(self._channel)
        self.wanted: dict[str, str] = {}  # identity -> service account
        self.versions: dict[str, str] = {}
        self.expectations = ExpectedProxies(self._list_expected, expectation)
        self.connected = asyncio.Event()

    async def close(self) -> None:
        await self._channel.close()

    # -- proxies ---------------------------------------------------------------------

    async def expected(self, common_name: str) -> str | None:
        """The service account of an expected proxy, or None; raises
        :class:`~.expected.ExpectationUnknown` if the catalog cannot be asked."""
        return await self.expectations.account(common_name)

    async def _list_expected(self) -> dict[str, str]:
        listed = await self._stub.ListProxies(pb.ListProxiesRequest(), timeout=10)
        return {p.common_name: p.service_account for p in listed.proxies if p.expected}

    async def register(self, common_name: str, address: str) -> None:
        await self._stub.RegisterProxy(
            pb.RegisterProxyRequest(common_name=common_name, proxy_cp=self._name, address=address),
            timeout=10,
        )

    async def unregister(self, common_name: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._stub.UnregisterProxy(
                pb.UnregisterProxyRequest(common_name=common_name), timeout=10
            )

    # -- views -----------------------------------------------------------------------

    async def view(self, identity: str, service_account: str = "") -> pb.View:
        view = await self._stub.GetView(
            pb.GetViewRequest(identity=identity, service_account=service_account), timeout=10
        )
        self.versions[identity] = view.version
        return view

    async def want(self, identity: str, service_account: str) -> pb.View:
        self.wanted[identity] = service_account
        return await self.view(identity, service_account)

    def forget(self, identity: str) -> None:
        self.wanted.pop(identity, None)
        self.versions.pop(identity, None)

    async def run(self, stop: asyncio.Event) -> None:
        await _ViewFollower(self).run(stop)

    async def _refresh(self, identity: str) -> None:
        account = self.wanted.get(identity)
        if account is None:
            return
        view = await self.view(identity, account)  # an RPC error ends the session
        try:
            await self._on_view(identity, view)
        except Exception as exc:  # one identity's view never stops the others
            log.exception("catalog.view_failed identity=%s", identity)
            self.health.rejections.reject("catalog view", identity, describe(exc))
            return
        self.health.rejections.accept("catalog view", identity)


class _ViewFollower(StreamFollower[pb.ViewEvent]):
    """``WatchViews``: refetch each wanted identity whose version moved."""

    def __init__(self, client: CatalogClient) -> None:
        super().__init__(f"catalog views {client.address}", client.loops)
        self.client = client

    def open(self) -> AsyncIterable[pb.ViewEvent]:
        return self.client._stub.WatchViews(pb.WatchViewsRequest())

    async def resync(self, first: pb.ViewEvent) -> None:
        client = self.client
        current = {i.identity: i.version for i in first.identities}
        for identity in list(client.wanted):
            if current.get(identity, "0") != client.versions.get(identity):
                await client._refresh(identity)
        client.connected.set()

    async def apply(self, event: pb.ViewEvent) -> None:
        client = self.client
        for item in event.identities:
            if item.identity in client.wanted and item.version != client.versions.get(
                item.identity
            ):
                await client._refresh(item.identity)

    def lost(self) -> None:
        self.client.connected.clear()
