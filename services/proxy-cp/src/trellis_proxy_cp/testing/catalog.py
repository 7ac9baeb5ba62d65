"""The catalog's ``ListProxies`` served over real gRPC, and a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import grpc

from trellis_api import catalog_pb2


class FakeCatalog:
    """The catalog's ``ListProxies`` on a real grpc.aio server (see :func:`fake_catalog`):
    lists ``expected`` (common name -> service account) and counts ``calls``. While ``gate``
    is set to an unset event, answers wait for it; with ``failing``, calls fail UNAVAILABLE."""

    def __init__(self, expected: Mapping[str, str] | None = None) -> None:
        self.expected = dict(expected or {})
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.failing = False
        self.address = ""

    async def ListProxies(
        self, request: catalog_pb2.ListProxiesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> catalog_pb2.ListProxiesResponse:
        self.calls += 1
        listed = catalog_pb2.ListProxiesResponse(
            proxies=[
                catalog_pb2.ProxyStatus(common_name=name, service_account=account, expected=True)
                for name, account in self.expected.items()
            ]
            + [catalog_pb2.ProxyStatus(common_name="connected-only.x.y", expected=False)]
        )
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "catalog is restarting")
        return listed

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            self.ListProxies,
            request_deserializer=catalog_pb2.ListProxiesRequest.FromString,
            response_serializer=catalog_pb2.ListProxiesResponse.SerializeToString,
        )
        service = catalog_pb2.DESCRIPTOR.services_by_name["Catalog"].full_name
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"ListProxies": handler}),)
        )


@asynccontextmanager
async def fake_catalog(expected: Mapping[str, str] | None = None) -> AsyncIterator[FakeCatalog]:
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
