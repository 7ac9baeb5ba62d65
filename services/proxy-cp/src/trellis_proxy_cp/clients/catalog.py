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
from collections.abc import Awaitable, Callable

import grpc

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_common.follow import follow_forever
from trellis_proxy_cp.clients.expected import ExpectationTiming, ExpectedProxies

log = logging.getLogger(__name__)

OnView = Callable[[str, pb.View], Awaitable[None]]


class CatalogClient:
    def __init__(
        self,
        address: str,
        on_view: OnView,
        proxy_cp_name: str = "proxy-cp",
        expectation: ExpectationTiming | None = None,
    ) -> None:
        self.address = address
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
        await follow_forever(
            lambda: self._follow(stop),
            stop,
            what=f"catalog {self.address}",
            on_lost=self.connected.clear,
        )

    async def _refresh(self, identity: str) -> None:
        account = self.wanted.get(identity)
        if account is None:
            return
        view = await self.view(identity, account)
        await self._on_view(identity, view)

    async def _follow(self, stop: asyncio.Event) -> None:
        stream = self._stub.WatchViews(pb.WatchViewsRequest())
        stopper = asyncio.create_task(stop.wait())
        try:
            events = aiter(stream)
            first = await anext(events)
            self.connected.set()
            current = {i.identity: i.version for i in first.identities}
            for identity in list(self.wanted):
                if current.get(identity, "0") != self.versions.get(identity):
                    await self._refresh(identity)
            while True:
                reading = asyncio.ensure_future(anext(events))
                await asyncio.wait({reading, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stopper.done():
                    reading.cancel()
                    return
                event = reading.result()
                for item in event.identities:
                    if item.identity in self.wanted and item.version != self.versions.get(
                        item.identity
                    ):
                        await self._refresh(item.identity)
        finally:
            stopper.cancel()
            stream.cancel()
