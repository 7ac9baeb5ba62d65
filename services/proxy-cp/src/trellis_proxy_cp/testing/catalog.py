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
from trellis_proxy_cp.cache import inputs
from trellis_runtime.locate import Locator

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
    * ``GetResources`` answers policies and slices from ``views`` (each whole view split as
      :func:`~trellis_proxy_cp.cache.inputs.split` does; an identity nothing declares gets
      an empty policy, as the real catalog gives it an outbound-only one) and destinations
      from ``destinations``; it counts ``view_calls`` (per identity whose policy was asked)
      and keeps each request's names in ``gets``.
    * ``ListChanges`` lists the resources :meth:`set_view`, :meth:`remove_view` and
      :meth:`set_destination` changed since a cursor (``<epoch>-<sequence>``), or every
      resource (``full``) for an empty cursor or one of another epoch (:meth:`restart`).
    * ``WatchChanges`` answers as ListChanges, then again after each change, the moved
      slices and destinations inline, as the catalog does; it counts ``watches``.
      :meth:`restart` ends the watches (a new process).
    * ``RegisterProxy`` and ``UnregisterProxy`` keep ``registered`` (common name -> proxy-cp).

    With ``failing``, every call fails UNAVAILABLE.
    """

    def __init__(self, expected: Mapping[str, str] | None = None) -> None:
        self.expected = dict(expected or {})
        self.serials: dict[str, str] = {}  # common name -> current serial, when set
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.failing = False
        self.address = ""
        self.views: dict[str, pb.View] = {}
        self.destinations: dict[str, pb.Destination] = {}  # "<namespace>/<name>" ->
        self.view_calls: Counter[str] = Counter()
        self.gets: list[list[str]] = []  # the names of each GetResources
        self.listings: list[str] = []  # the ``since`` of each ListChanges
        self.registered: dict[str, str] = {}
        self.epoch = f"e{next(_epochs)}"
        self._sequence = 0
        self._changed: dict[str, int] = {}  # resource name -> sequence of its last change
        self._resources: dict[str, pb.Resource] = {}
        self.watches = 0
        self._moved = asyncio.Event()  # rung, and replaced, at each change or restart

    @property
    def cursor(self) -> str:
        return f"{self.epoch}-{self._sequence}"

    async def set_view(self, view: pb.View) -> str:
        """Store ``view`` (its policy and slices) and signal what moved; the new cursor."""
        self.views[view.identity] = view
        return await self._change()

    async def remove_view(self, identity: str) -> str:
        self.views.pop(identity, None)
        return await self._change()

    async def set_destination(self, destination: pb.Destination) -> str:
        self.destinations[f"{destination.namespace}/{destination.name}"] = destination
        return await self._change()

    async def remove_destination(self, name: str) -> str:
        self.destinations.pop(name, None)
        return await self._change()

    def restart(self) -> None:
        """A new catalog process: a new epoch, and the registrations forgotten."""
        self.epoch = f"e{next(_epochs)}"
        self._sequence = 0
        self._changed = {name: 0 for name in self._resources}
        self.registered.clear()
        self._ring()

    def _ring(self) -> None:
        rung, self._moved = self._moved, asyncio.Event()
        rung.set()

    def _current(self) -> dict[str, pb.Resource]:
        found: dict[str, pb.Resource] = {}
        for identity, view in sorted(self.views.items()):
            split = inputs.split(view)
            name = f"policy/{identity}"
            found[name] = pb.Resource(name=name, version=split.policy.version, policy=split.policy)
            for slice_name, content in split.slices.items():
                found[slice_name] = pb.Resource(
                    name=slice_name, version=content.version, slice=content
                )
        for key, destination in sorted(self.destinations.items()):
            name = f"destination/{key}"
            found[name] = pb.Resource(
                name=name, version=destination.version, destination=destination
            )
        return found

    async def _change(self) -> str:
        current = self._current()
        moved = [
            n
            for n in current.keys() | self._resources.keys()
            if n not in current
            or n not in self._resources
            or current[n].version != self._resources[n].version
        ]
        self._resources = current
        if moved:
            self._sequence += 1
            for name in moved:
                self._changed[name] = self._sequence
            self._ring()
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

    async def GetResources(
        self, request: pb.GetResourcesRequest, context: Context
    ) -> pb.GetResourcesResponse:
        await self._enter(context)
        self.gets.append(list(request.names))
        answer = pb.GetResourcesResponse()
        for name in request.names:
            found = self._resources.get(name)
            if found is None and name.startswith("policy/"):
                identity = name.removeprefix("policy/")
                empty = inputs.split(pb.View(identity=identity)).policy
                found = pb.Resource(name=name, version=empty.version, policy=empty)
            if name.startswith("policy/"):
                self.view_calls[name.removeprefix("policy/")] += 1
            if found is None:
                answer.missing.append(name)
            else:
                answer.resources.append(found)
        return answer

    async def ListChanges(
        self, request: pb.ListChangesRequest, context: Context
    ) -> pb.ListChangesResponse:
        await self._enter(context)
        self.listings.append(request.since)
        return self._listing(request.since)

    async def WatchChanges(
        self, request: pb.ListChangesRequest, context: Context
    ) -> AsyncIterator[pb.ListChangesResponse]:
        await self._enter(context)
        self.watches += 1
        since, epoch, first = request.since, self.epoch, True
        while epoch == self.epoch:
            listed = self._listing(since)
            if first or listed.changes:
                if not listed.full:
                    listed.resources.extend(
                        self._resources[c.name]
                        for c in listed.changes
                        if c.version and not c.name.startswith("policy/")
                    )
                yield listed
            first, since, moved = False, listed.cursor, self._moved
            await moved.wait()
            await self._enter(context)

    def _listing(self, since_cursor: str) -> pb.ListChangesResponse:
        epoch, _, after = since_cursor.rpartition("-")
        full = epoch != self.epoch or not after.isdigit()
        since = 0 if full else int(after)
        return pb.ListChangesResponse(
            cursor=self.cursor,
            full=full,
            changes=[
                pb.ResourceVersion(name=name, version=self._version(name))
                for name, sequence in sorted(self._changed.items())
                if (full and name in self._resources) or (not full and sequence > since)
            ],
        )

    def _version(self, name: str) -> str:
        found = self._resources.get(name)
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
        watch = grpc.unary_stream_rpc_method_handler(
            self.WatchChanges,
            request_deserializer=pb.ListChangesRequest.FromString,
            response_serializer=pb.ListChangesResponse.SerializeToString,
        )
        methods: dict[str, tuple[Callable[[Any, Context], Awaitable[Message]], type[Message]]] = {
            "ListProxies": (self.ListProxies, pb.ListProxiesRequest),
            "GetResources": (self.GetResources, pb.GetResourcesRequest),
            "ListChanges": (self.ListChanges, pb.ListChangesRequest),
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
        handlers["WatchChanges"] = watch
        service = pb.DESCRIPTOR.services_by_name["Catalog"].full_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))


@asynccontextmanager
async def fake_catalog(
    expected: Mapping[str, str] | None = None,
) -> AsyncIterator[FakeCatalog]:
    """A :class:`FakeCatalog` serving on a free port of 127.0.0.1 (``address``)."""
    catalog = FakeCatalog(expected)
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
