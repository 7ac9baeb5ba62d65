"""The server side of the xDS benchmark, in its own process: proxy-cp, or the floor.

``python -m bench.xds_server trellis|floor GROUPS [PORT]`` serves ADS on 127.0.0.1:PORT
(default 0: any; a replica names the first one's port, shared with SO_REUSEPORT; insecure,
grpc.aio, the options of :data:`trellis_runtime.grpcserver.DEFAULT_OPTIONS`) for the groups
of :mod:`bench.xds_mesh`. Running apart from the client
keeps the two processes' CPU time apart (``/proc/<pid>/stat`` of this process is the
server's cost) and gives each a core.

* ``trellis``: proxy-cp as ``main.py`` wires it, minus TLS and the catalog and certmanager
  clients: a real :class:`SnapshotCache`, :class:`ProxyControlPlane` (views and material
  come from :mod:`bench.xds_mesh` instead of the catalog and certmanager),
  :class:`ProxyHooks` with real Prometheus metrics, and :class:`AdsServicer`. Its
  authorizer asks proxy-cp's real :class:`CatalogClient` whether the proxy is expected, as
  ``MeshAuthorizer`` does, with the node id for the certificate's common name, then
  attaches the stream to the control plane, the group read from the node id. The catalog
  it asks is a stand-in on the same server (same process, same event loop, so its cost
  counts as the server's): ``ListProxies`` lists the proxies expected so far (the first
  ``GROUPS``, until ``expect``), and counts the calls. A change is what the catalog
  client does with a changed slice: ``apply`` it (the one ClusterLoadAssignment translated
  and serialized once, every group holding it takes it into a snapshot whose other types
  are shared, the streams woken).
* ``floor``: a bare servicer of the same method (a generic handler, responses passed to
  grpc as bytes): each stream has a reader and a writer task; a request with an empty
  nonce gets the pre-serialized response of its type, anything else is read and only
  counted. A change puts the same pre-serialized EDS response (one per group, built and
  serialized once, before the trigger) on every stream's queue.

Commands on stdin, one per line; each answer is one JSON line on stdout, the first being
``{"port": P}`` once the server listens:

* ``prepare K``: build what change ``K`` needs (views, or the floor's response bytes);
* ``expect K``: the catalog stand-in expects the first ``K`` proxies from now on;
* ``push K``: make change ``K``; answers ``{"set_s": S}``, the seconds spent making it;
* ``stats``: ``{"streams": open streams, "acks": EDS ACKs of the latest change, "gc_s":
  seconds in the garbage collector since that change, "gc_full": full collections,
  "lag_max_s": the event loop's worst stall since that change (the services' probe,
  :class:`~trellis_runtime.looplag.LoopLag`),
  "list_proxies": ListProxies calls the catalog stand-in answered (trellis only)}``;
* ``profile start`` / ``profile stop PATH``: cProfile this process's event loop thread
  (the file holds every interval profiled so far).

End of input stops the server. Logs (proxy-cp's INFO lines included) go to stderr.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import json
import logging
import resource
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from prometheus_client import CollectorRegistry

from bench import xds_mesh
from trellis_common import logs
from trellis_proxy_cp import types
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.hooks import ProxyHooks
from trellis_proxy_cp.main import tune_garbage_collection
from trellis_proxy_cp.metrics import XdsMetrics
from trellis_proxy_cp.testing import FakeCatalog, locator
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.transport.ads import AdsServicer
from trellis_proxy_cp.transport.streamhooks import StreamHooks
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused
from trellis_runtime import grpcserver
from trellis_runtime.looplag import LoopLag

log = logging.getLogger("bench.xds_server")

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
_Context = grpc.aio.ServicerContext[Any, Any]


def raise_open_files(wanted: int) -> None:
    """Raise the soft RLIMIT_NOFILE towards ``wanted`` (never above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class Subject(Protocol):
    def register(self, server: grpc.aio.Server) -> None: ...
    def serving(self, port: int) -> None: ...
    def expect(self, count: int) -> None: ...
    def prepare(self, change: int) -> None: ...
    async def push(self, change: int) -> None: ...
    def stats(self) -> dict[str, int]: ...


class _BenchCatalog(FakeCatalog):
    """The catalog as proxy-cp's fake serves it (a real grpc.aio server); the benchmark
    asks only ``ListProxies``: the benchmark's first proxies, expected; calls counted."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self._groups = groups
        self.expect(groups)

    def expect(self, count: int) -> None:
        """List the first ``count`` proxies from now on (as when that many were onboarded)."""
        self.expected = {
            xds_mesh.node_id(i, self._groups): xds_mesh.account(i % self._groups)
            for i in range(count)
        }


class _BenchAuthorizer:
    """``MeshAuthorizer`` without a certificate: the node id is asked for as the common
    name, and the group comes from it."""

    def __init__(
        self,
        control_plane: ProxyControlPlane,
        groups: int,
        expected: Callable[[str], Awaitable[Expectation | None]],
    ) -> None:
        self._control_plane = control_plane
        self._groups = groups
        self._expected = expected

    async def authorize(self, context: _Context, node: Any) -> ProxyStream:
        if await self._expected(node.id) is None:
            raise StreamRefused(grpc.StatusCode.PERMISSION_DENIED, f"{node.id} is not expected")
        try:
            group = xds_mesh.group_of(node.id)
        except (ValueError, IndexError):
            group = -1
        if not 0 <= group < self._groups:
            raise StreamRefused(grpc.StatusCode.PERMISSION_DENIED, f"unknown node {node.id!r}")
        identity = xds_mesh.identity(group)
        key = await self._control_plane.attach(
            node.id, identity, xds_mesh.account(group), xds_mesh.SETTINGS
        )
        return ProxyStream(proxy_id=node.id, key=key, node_id=node.id, identity=identity)


class _CountingHooks:
    """proxy-cp's hooks, plus a count of EDS ACKs of the versions the latest change set."""

    def __init__(self, inner: StreamHooks) -> None:
        self._inner = inner
        self.expected: dict[str, str] = {}  # snapshot key -> EDS version of the change
        self.acks = 0

    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        self._inner.on_refused(proxy_id, protocol, refused)

    def on_open(self, stream: ProxyStream) -> None:
        self._inner.on_open(stream)

    def on_close(self, stream: ProxyStream) -> None:
        self._inner.on_close(stream)

    def on_sent(self, stream: ProxyStream, type_url: types.TypeUrl, version: str) -> None:
        self._inner.on_sent(stream, type_url, version)

    def on_ack(self, stream: ProxyStream, type_url: types.TypeUrl, version: str) -> None:
        self._inner.on_ack(stream, type_url, version)
        if type_url == types.ENDPOINT and self.expected.get(stream.key) == version:
            self.acks += 1

    def on_nack(
        self, stream: ProxyStream, type_url: types.TypeUrl, version: str, error_message: str
    ) -> None:
        self._inner.on_nack(stream, type_url, version, error_message)


class Trellis:
    """proxy-cp's cache, core, hooks and ADS servicer (see the module docstring)."""

    def __init__(self, groups: int) -> None:
        self._groups = groups
        self._inputs = {xds_mesh.identity(g): xds_mesh.inputs(g) for g in range(groups)}
        self._material = xds_mesh.material()
        self._next: dict[str, Any] = {}
        self.cache = SnapshotCache()
        self.control_plane = ProxyControlPlane(self.cache, self._fetch_inputs, self._fetch_material)

        async def register(proxy: str, address: str) -> None:
            return None

        async def unregister(proxy: str) -> None:
            return None

        metrics = XdsMetrics(CollectorRegistry())
        self.hooks = _CountingHooks(ProxyHooks(self.control_plane, metrics, register, unregister))
        self.catalog = _BenchCatalog(groups)
        self._client: CatalogClient | None = None
        self.servicer = AdsServicer(
            self.cache, _BenchAuthorizer(self.control_plane, groups, self._expected), self.hooks
        )

    async def _expected(self, common_name: str) -> Expectation | None:
        assert self._client is not None
        return await self._client.expected(common_name)

    async def _on_resources(self, policies: Any, slices: Any) -> None:
        return None

    async def _fetch_inputs(self, identity: str, account: str) -> Any:
        return self._inputs[identity]

    async def _fetch_material(self, identity: str, account: str) -> SecretMaterial:
        return self._material

    def register(self, server: grpc.aio.Server) -> None:
        self.servicer.register(server)
        self.catalog.register(server)

    def serving(self, port: int) -> None:
        self._client = CatalogClient(locator(f"127.0.0.1:{port}"), self._on_resources, "bench")

    def expect(self, count: int) -> None:
        self.catalog.expect(count)

    def prepare(self, change: int) -> None:
        self._next = xds_mesh.changed_slices(change)

    async def push(self, change: int) -> None:
        await self.control_plane.apply({}, self._next)
        self.hooks.acks = 0
        self.hooks.expected = {}
        for key in self.control_plane.groups:
            snapshot = self.cache.get(key)
            if snapshot is not None:
                self.hooks.expected[key] = snapshot.version_of(types.ENDPOINT)

    def stats(self) -> dict[str, int]:
        return {
            "streams": len(self.servicer.registry),
            "acks": self.hooks.acks,
            "list_proxies": self.catalog.calls,
        }


class _FloorStream:
    def __init__(self, group: int) -> None:
        self.group = group
        self.outbox: asyncio.Queue[bytes] = asyncio.Queue()


class Floor:
    """The bare ADS server: pre-serialized responses, written as bytes (module docstring)."""

    def __init__(self, groups: int) -> None:
        self._groups = groups
        self._initial: dict[tuple[int, str], bytes] = {}
        for g in range(groups):
            snapshot = xds_mesh.snapshot(g)
            for type_url in snapshot.type_urls():
                self._initial[g, type_url] = xds_mesh.response(snapshot, type_url, "1")
        self._streams: set[_FloorStream] = set()
        self._next: dict[int, bytes] = {}
        self._push: dict[int, bytes] = {}
        self._versions: dict[int, str] = {}
        self._nonce = ""
        self.acks = 0

    def register(self, server: grpc.aio.Server) -> None:
        handler: grpc.RpcMethodHandler[Any, bytes] = grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
            response_serializer=None,  # the responses are bytes already
        )
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    ADS_SERVICE, {"StreamAggregatedResources": handler}
                ),
            )
        )

    def serving(self, port: int) -> None:
        pass

    def expect(self, count: int) -> None:
        pass

    def prepare(self, change: int) -> None:
        self._next = {}
        for g in range(self._groups):
            snapshot = xds_mesh.snapshot(g, change)
            self._next[g] = xds_mesh.response(snapshot, types.ENDPOINT, f"p{change}")
            self._versions[g] = snapshot.version_of(types.ENDPOINT)
        self._nonce = f"p{change}"

    async def push(self, change: int) -> None:
        self._push, self.acks = self._next, 0
        for stream in self._streams:
            stream.outbox.put_nowait(self._push[stream.group])

    def stats(self) -> dict[str, int]:
        return {"streams": len(self._streams), "acks": self.acks, "list_proxies": 0}

    async def _stream(self, requests: AsyncIterator[Any], context: _Context) -> None:
        first = await anext(aiter(requests))
        stream = _FloorStream(xds_mesh.group_of(first.node.id))
        self._streams.add(stream)
        reader = asyncio.create_task(self._read(stream, first, requests))
        writer = asyncio.create_task(self._write(stream, context))
        try:
            await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._streams.discard(stream)
            reader.cancel()
            writer.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)

    async def _read(self, stream: _FloorStream, first: Any, requests: AsyncIterator[Any]) -> None:
        self._answer(stream, first)
        async for request in requests:
            self._answer(stream, request)

    def _answer(self, stream: _FloorStream, request: Any) -> None:
        if not request.response_nonce:
            stream.outbox.put_nowait(self._initial[stream.group, request.type_url])
        elif (
            request.response_nonce == self._nonce
            and request.version_info == self._versions[stream.group]
        ):
            self.acks += 1

    @staticmethod
    async def _write(stream: _FloorStream, context: _Context) -> None:
        while True:
            await context.write(await stream.outbox.get())


class GcClock:
    """CPU time spent in the cyclic garbage collector since :meth:`reset` (``gc.callbacks``;
    thread CPU time, so that being preempted during a collection does not count)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.full = 0  # collections of the oldest generation
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def reset(self) -> None:
        self.seconds, self.full = 0.0, 0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.seconds += time.thread_time() - self._started
            self.full += info["generation"] == 2


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


async def serve(kind: str, groups: int, port: int = 0) -> None:
    raise_open_files(65536)
    subject: Subject = Trellis(groups) if kind == "trellis" else Floor(groups)
    server = grpc.aio.server(options=list(grpcserver.DEFAULT_OPTIONS))
    subject.register(server)
    # A replica binds the port of the first (grpcio sets SO_REUSEPORT): the kernel spreads
    # the client's connections over them, as over proxy-cp replicas.
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    subject.serving(port)
    if kind == "trellis":
        tune_garbage_collection()  # as proxy-cp's build does, before it serves
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    _answer({"port": port})
    profiler: cProfile.Profile | None = None
    collector = GcClock()
    probe = LoopLag(CollectorRegistry())  # as every service runs it (ServiceRuntime.serve)
    lag = asyncio.create_task(probe.run(asyncio.Event()))
    try:
        while line := (await commands.readline()).decode().strip():
            command, *args = line.split()
            if command == "prepare":
                subject.prepare(int(args[0]))
                _answer({})
            elif command == "expect":
                subject.expect(int(args[0]))
                _answer({})
            elif command == "push":
                collector.reset()
                probe.peak = 0.0
                start = time.perf_counter()
                await subject.push(int(args[0]))
                _answer({"set_s": time.perf_counter() - start})
            elif command == "stats":
                stats = {"gc_s": collector.seconds, "gc_full": collector.full}
                _answer({**subject.stats(), **stats, "lag_max_s": probe.peak})
            elif command == "profile" and args[0] == "start":
                profiler = profiler or cProfile.Profile()
                profiler.enable()
                _answer({})
            elif command == "profile" and args[0] == "stop" and profiler is not None:
                profiler.disable()
                profiler.dump_stats(args[1])  # every change profiled so far
                _answer({})
            else:
                _answer({"error": f"unknown command {line!r}"})
    finally:
        lag.cancel()
        await server.stop(None)


def main(argv: list[str]) -> int:
    kind, groups = argv[0], int(argv[1])
    port = int(argv[2]) if len(argv) > 2 else 0
    if kind not in ("trellis", "floor"):
        raise SystemExit(
            f"usage: python -m bench.xds_server trellis|floor GROUPS [PORT] (not {kind!r})"
        )
    logs.configure("kv", "INFO", f"bench-xds-{kind}")
    asyncio.run(serve(kind, groups, port))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
