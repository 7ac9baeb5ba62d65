"""A real ADS server with a real grpcio client, hooks that record and a fake authorizer.

:class:`AdsClient` drives one stream the way Envoy does. Every wait is bounded (2 s) so a bug
fails a test instead of hanging it, and :meth:`AdsClient.quiet` proves that *nothing* was
sent without sleeping: it sends a request for a type the stream never asked for, which the
server always answers, and checks that this answer is the next message (the server handles a
stream's requests in order and sends in order)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2

from trellis_proxy_cp.cache.store import SnapshotSource
from trellis_proxy_cp.testing.control import SIDECAR
from trellis_proxy_cp.transport.ads import AdsServicer
from trellis_proxy_cp.transport.limits import StreamLimits
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, TypeUrl

TIMEOUT = 2.0

_PREFIX = "type.googleapis.com/"


@dataclasses.dataclass
class RecordingHooks:
    """Hooks that record every call as ``(hook, proxy_id, type_url, version[, message])``;
    refusals as ``("refused", proxy_id, protocol, code, reason)``."""

    calls: list[tuple[str, ...]] = dataclasses.field(default_factory=list)

    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        self.calls.append(("refused", proxy_id, protocol, refused.code.name, refused.reason))

    def on_open(self, stream: ProxyStream) -> None:
        self.calls.append(("open", stream.proxy_id))

    def on_close(self, stream: ProxyStream) -> None:
        self.calls.append(("close", stream.proxy_id))

    def on_sent(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self.calls.append(("sent", stream.proxy_id, type_url, version))

    def on_ack(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self.calls.append(("ack", stream.proxy_id, type_url, version))

    def on_nack(
        self, stream: ProxyStream, type_url: TypeUrl, version: str, error_message: str
    ) -> None:
        self.calls.append(("nack", stream.proxy_id, type_url, version, error_message))

    def of(self, hook: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == hook and not _is_probe(c)]


def _is_probe(call: tuple[str, ...]) -> bool:
    return len(call) > 2 and call[2].startswith(PROBE_PREFIX)


class StaticAuthorizer:
    """Proxy id = node id; key from ``keys`` (else ``default_key``); ``refuse`` by node id."""

    def __init__(
        self,
        keys: Mapping[str, str] | None = None,
        default_key: str = "mesh",
        refuse: Mapping[str, tuple[grpc.StatusCode, str]] | None = None,
    ) -> None:
        self.keys = dict(keys or {})
        self.default_key = default_key
        self.refuse = dict(refuse or {})

    async def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], node: Any
    ) -> ProxyStream:
        if node.id in self.refuse:
            code, message = self.refuse[node.id]
            raise StreamRefused(code, message)
        key = self.keys.get(node.id, self.default_key)
        return ProxyStream(proxy_id=node.id, key=key, node_id=node.id, identity=f"id-{node.id}")


PROBE_PREFIX = _PREFIX + "trellis.test.Probe"
_probes = itertools.count()


class AdsClient:
    """One ADS stream (SotW or delta) driven by hand, with bounded waits."""

    def __init__(self, call: Any, delta: bool) -> None:
        self.call = call
        self.delta = delta
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                await self._inbox.put(response)
        except grpc.aio.AioRpcError as error:
            await self._inbox.put(error)
        await self._inbox.put(None)

    async def send(self, **fields: Any) -> None:
        message = (
            discovery_pb2.DeltaDiscoveryRequest(**fields)
            if self.delta
            else discovery_pb2.DiscoveryRequest(**fields)
        )
        await asyncio.wait_for(self.call.write(message), TIMEOUT)

    async def ack(self, response: Any, names: list[str] | None = None) -> None:
        """ACK ``response`` like Envoy (SotW: with its version and the given names)."""
        if self.delta:
            await self.send(type_url=response.type_url, response_nonce=response.nonce)
        else:
            await self.send(
                type_url=response.type_url,
                version_info=response.version_info,
                response_nonce=response.nonce,
                resource_names=names or [],
            )

    async def nack(
        self, response: Any, message: str, accepted: str = "", names: list[str] | None = None
    ) -> None:
        """NACK ``response`` (SotW: ``accepted`` is the last version the proxy accepted)."""
        error = {"code": 13, "message": message}  # a google.rpc.Status
        if self.delta:
            await self.send(
                type_url=response.type_url, response_nonce=response.nonce, error_detail=error
            )
        else:
            await self.send(
                type_url=response.type_url,
                version_info=accepted,
                response_nonce=response.nonce,
                resource_names=names or [],
                error_detail=error,
            )

    async def recv(self, timeout: float = TIMEOUT) -> Any:
        """The next response; fails on the end of the stream or after ``timeout``."""
        item = await asyncio.wait_for(self._inbox.get(), timeout)
        if item is None or isinstance(item, grpc.aio.AioRpcError):
            raise AssertionError(f"stream ended: {item!r}")
        return item

    async def status(self) -> grpc.StatusCode:
        """Wait for the end of the stream and return its status code."""
        while True:
            item = await asyncio.wait_for(self._inbox.get(), TIMEOUT)
            if isinstance(item, grpc.aio.AioRpcError):
                return item.code()
            if item is None:
                return await asyncio.wait_for(self.call.code(), TIMEOUT)

    async def details(self) -> str:
        return str(await asyncio.wait_for(self.call.details(), TIMEOUT))

    async def quiet(self) -> None:
        """Assert that nothing was sent since the last :meth:`recv` (see module docstring)."""
        type_url = f"{PROBE_PREFIX}{next(_probes)}"
        await self.send(type_url=type_url)
        response = await self.recv()
        assert response.type_url == type_url, f"unexpected response: {response}"

    async def close(self) -> None:
        await self.call.done_writing()
        self._reader.cancel()
        self.call.cancel()


def names_of(response: Any) -> list[str]:
    """Resource names of a SotW or delta response, in order."""
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return [r.name for r in response.resources]
    out = []
    for packed in response.resources:
        kind = _MESSAGES[TypeUrl(packed.type_url)]()
        packed.Unpack(kind)
        out.append(kind.cluster_name if packed.type_url == ENDPOINT else kind.name)
    return out


_MESSAGES: dict[TypeUrl, Any] = {
    CLUSTER: cluster_pb2.Cluster,
    ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    LISTENER: listener_pb2.Listener,
    ROUTE: route_pb2.RouteConfiguration,
    SECRET: secret_pb2.Secret,
}


@dataclasses.dataclass
class AdsHarness:
    """A real grpc.aio server with :class:`AdsServicer` on 127.0.0.1 and a channel to it."""

    servicer: AdsServicer
    channel: grpc.aio.Channel
    clients: list[AdsClient] = dataclasses.field(default_factory=list)

    async def open(self, *, delta: bool = False) -> AdsClient:
        """Open a stream; the first :meth:`AdsClient.send` should carry ``node=node(...)``."""
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        call = stub.DeltaAggregatedResources() if delta else stub.StreamAggregatedResources()
        client = AdsClient(call, delta)
        self.clients.append(client)
        return client


def node(node_id: str = "envoy-1") -> base_pb2.Node:
    """A sidecar's node, its bootstrap naming its own workload certificate's folder (as
    every onboarding path writes it)."""
    metadata = struct_pb2.Struct()
    metadata.update({"trellis": {"workload_dir": SIDECAR.workload_dir}})
    return base_pb2.Node(id=node_id, cluster="test", metadata=metadata)


@asynccontextmanager
async def ads_server(
    source: SnapshotSource,
    *,
    authorizer: Any = None,
    hooks: Any = None,
    queue_size: int = 64,
    stream_limits: StreamLimits | None = None,
) -> AsyncIterator[AdsHarness]:
    """Serve ADS for ``source`` on a free port; close every client and the server after."""
    servicer = AdsServicer(
        source,
        authorizer or StaticAuthorizer(),
        hooks=hooks,
        queue_size=queue_size,
        stream_limits=stream_limits,
    )
    server = grpc.aio.server()
    servicer.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    harness = AdsHarness(servicer, channel)
    try:
        yield harness
    finally:
        for client in harness.clients:
            client._reader.cancel()
            client.call.cancel()
        await channel.close()
        await server.stop(None)
        # Let grpc's per-RPC tasks see their handlers end before the loop closes.
        for _ in range(3):
            await asyncio.sleep(0)
