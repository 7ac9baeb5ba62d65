"""The catalog as proxy-cp uses it, served over real gRPC; a locator for it; a fake clock."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import grpc
import redis.asyncio
from google.protobuf.message import Message

from trellis_api import catalog_pb2 as pb
from trellis_common.locate import Locator
from trellis_common.signaling import Publisher

Context = grpc.aio.ServicerContext[Any, Any]
_epochs = itertools.count(1)


def locator(address: str, kind: str = "catalog") -> Locator:
    """A locator of an owner at a known address: it never asks the registry, and the Redis
    client it holds is never connected."""
    return Locator(redis.asyncio.Redis(), kind, address)


class FakeCatalog:
    """The catalog's RPCs that proxy-cp calls, on a real grpc.aio server (see
    :func:`fake_catalog`).

    * ``ListProxies`` lists ``expected`` (common name -> service account) and counts
      ``calls``. While ``gate`` is set to an unset event, its answers wait for it.
    * ``GetView`` answers from ``views`` (an identity nothing declares gets an empty view,
      as the real catalog gives it an outbound-only one) and counts ``view_calls``.
    * ``ListViewVersions`` lists what :meth:`set_view` and :meth:`remove_view` changed since
      a cursor (``<epoch>:<sequence>``), or every identity (``full``) for an empty cursor or
      one of another epoch (:meth:`restart`).
    * ``RegisterProxy`` and ``UnregisterProxy`` keep ``registered`` (common name -> proxy-cp).

    With ``failing``, every call fails UNAVAILABLE. With a ``publisher``, each change is
    signalled on the topic ``views`` (kind ``changed``, key: the new cursor), as the catalog
    does after a flush.
    """

    def __init__(
        self, expected: Mapping[str, str] | None = None, publisher: Publisher | None = None
    ) -> None:
        self.expected = dict(expected or {})
        self.serials: dict[str, str] = {}  # common name -> current serial, when set
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.failing = False
        self.address = ""
        self.publisher = publisher
        self.views: dict[str, pb.View] = {}
        self.view_calls: Counter[str] = Counter()
        self.listings: list[str] = []  # the ``since`` of each ListViewVersions
        self.registered: dict[str, str] = {}
        self.epoch = f"e{next(_epochs)}"
        self._sequence = 0
        self._changed: dict[str, int] = {}  # identity -> sequence of its last change

    @property
    def cursor(self) -> str:
        return f"{self.epoch}:{self._sequence}"

    async def set_view(self, view: pb.View) -> str:
        """Store ``view`` (a new version of its identity) and signal it; the new cursor."""
        self.views[view.identity] = view
        return await self._change(view.identity)

    async def remove_view(self, identity: str) -> str:
        self.views.pop(identity, None)
        return await self._change(identity)

    def restart(self) -> None:
        """A new catalog process: a new epoch, and the registrations forgotten."""
        self.epoch = f"e{next(_epochs)}"
        self._sequence = 0
        self._changed = {identity: 0 for identity in self.views}
        self.registered.clear()

    async def signal(self) -> None:
        if self.publisher is not None:
            await self.publisher.publish("views", "changed", self.cursor)

    async def _change(self, identity: str) -> str:
        self._sequence += 1
        self._changed[identity] = self._sequence
        await self.signal()
        return self.cursor

    async def _enter(self, context: Context) -> None:
        if self.failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "catalog is restarting")

    async def ListProxies(
        self, request: pb.ListProxiesRequest, context: Context
    ) -> pb.ListProxiesResponse:
        self.calls += 1
        listed = pb.ListProxiesResponse(
            proxies=[
                pb.ProxyStatus(
                    common_name=name,
                    service_account=account,
                    expected=True,
                    serial=self.serials.get(name, ""),
                )
                for name, account in self.expected.items()
            ]
            + [pb.ProxyStatus(common_name="connected-only.x.y", expected=False)]
        )
        if self.gate is not None:
            await self.gate.wait()
        await self._enter(context)
        return listed

    async def GetView(self, request: pb.GetViewRequest, context: Context) -> pb.View:
        await self._enter(context)
        self.view_calls[request.identity] += 1
        found = self.views.get(request.identity)
        return found if found is not None else pb.View(identity=request.identity)

    async def ListViewVersions(
        self, request: pb.ListViewVersionsRequest, context: Context
    ) -> pb.ListViewVersionsResponse:
        await self._enter(context)
        self.listings.append(request.since)
        epoch, _, after = request.since.partition(":")
        full = epoch != self.epoch or not after.isdigit()
        since = 0 if full else int(after)
        return pb.ListViewVersionsResponse(
            cursor=self.cursor,
            full=full,
            identities=[
                pb.IdentityVersion(identity=identity, version=self._version(identity))
                for identity, sequence in sorted(self._changed.items())
                if (full and identity in self.views) or (not full and sequence > since)
            ],
        )

    def _version(self, identity: str) -> str:
        found = self.views.get(identity)
        return found.version if found is not None else ""

    async def RegisterProxy(
        self, request: pb.RegisterProxyRequest, context: Context
    ) -> pb.ProxyAck:
        await self._enter(context)
        self.registered[request.common_name] = request.proxy_cp
        return pb.ProxyAck(expected=request.common_name in self.expected)

    async def UnregisterProxy(
        self, request: pb.UnregisterProxyRequest, context: Context
    ) -> pb.ProxyAck:
        await self._enter(context)
        self.registered.pop(request.common_name, None)
        return pb.ProxyAck()

    def register(self, server: grpc.aio.Server) -> None:
        methods: dict[str, tuple[Callable[[Any, Context], Awaitable[Message]], type[Message]]] = {
            "ListProxies": (self.ListProxies, pb.ListProxiesRequest),
            "GetView": (self.GetView, pb.GetViewRequest),
            "ListViewVersions": (self.ListViewVersions, pb.ListViewVersionsRequest),
            "RegisterProxy": (self.RegisterProxy, pb.RegisterProxyRequest),
            "UnregisterProxy": (self.UnregisterProxy, pb.UnregisterProxyRequest),
        }
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            name: grpc.unary_unary_rpc_method_handler(
                method,
                request_deserializer=request_type.FromString,
                response_serializer=lambda answer: answer.SerializeToString(),
            )
            for name, (method, request_type) in methods.items()
        }
        service = pb.DESCRIPTOR.services_by_name["Catalog"].full_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


@asynccontextmanager
async def fake_catalog(
    expected: Mapping[str, str] | None = None, publisher: Publisher | None = None
) -> AsyncIterator[FakeCatalog]:
    """A :class:`FakeCatalog` serving on a free port of 127.0.0.1 (``address``)."""
    catalog = FakeCatalog(expected, publisher)
    server = grpc.aio.server()
    catalog.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    catalog.address = f"127.0.0.1:{port}"
    try:
        yield catalog
    finally:
        if catalog.gate is not None:
            catalog.gate.set()
        await server.stop(None)


class FakeClock:
    """A monotonic clock that moves only when told to, or when something sleeps on it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)
