"""The client side of the xDS benchmark: many Envoy-like state-of-the-world ADS streams.

A :class:`Fleet` opens N streams to one server over grpc.aio channels of ``per_channel``
streams each (every channel its own HTTP/2 connection: a local subchannel pool, so grpc
does not share one connection between channels). grpc's C core server sets no
``SETTINGS_MAX_CONCURRENT_STREAMS`` by default (300 streams on one channel all answered
here), so the channel size only decides how many connections there are; a real Envoy
has a connection of its own.

Each stream walks the protocol as Envoy does (``envoy-xds-facts.md``): CDS wildcard with the
node; on the CDS response, EDS for the clusters' ClusterLoadAssignments before the CDS
ACK; on EDS, its ACK; LDS wildcard; on LDS, RDS for the listeners' route configurations
before the LDS ACK; on RDS, its ACK; then SDS for every secret the clusters and listeners
name, and its ACK. Every ACK carries the version, the nonce and the names subscribed to.
Names are read from the resources with proxy-cp's own reference walkers
(:mod:`trellis_proxy_cp.cache.references`), once per type and version (streams of one
group see the same versions).

A stream that fails before it is synced is opened again after a jittered exponential
backoff (0.5 s base, as Envoy's ADS retry), and counted in :attr:`Fleet.retries`. That
happens when many streams open at once: grpc's C core server keeps RPCs that the
application has not yet picked up in a backlog and refuses new ones at random between 1,000
and 3,000 waiting (``grpc.server.max_pending_requests``, ``..._hard_limit``) with
RESOURCE_EXHAUSTED "Too many pending requests for this server"; grpc.aio's client reports
that as INTERNAL "Internal error from Core" on the next write (grpc/grpc#36066).

After that a stream ACKs whatever it is sent, and the fleet records, per round, when each
stream has written its ACK of the round's EDS push: :meth:`Fleet.begin` starts a round
at the trigger, :meth:`Fleet.wait` returns the per-stream latencies once every stream has
ACKed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2

from bench import xds_mesh
from trellis_proxy_cp.cache import references
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, TypeUrl

#: A simulated Envoy's node metadata, as a pod's bootstrap sets it: its own workload
#: certificate is in its agent's folder (proxy-cp refuses a sidecar that names none, and
#: serves ``service-cert`` as a reference to that folder).
NODE_METADATA = struct_pb2.Struct()
NODE_METADATA.update({"trellis": {"workload_dir": str(xds_mesh.SETTINGS.workload_dir)}})

SYNC_ATTEMPTS = 8
RETRY_BASE = 0.5  # seconds: Envoy's default base interval for ADS stream retries
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]


class _Names:
    """What a CDS or LDS response names (EDS or RDS names, secret names), by version."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], tuple[list[str], list[str]]] = {}

    def of(self, response: Any) -> tuple[list[str], list[str]]:
        key = (response.type_url, response.version_info)
        found = self._seen.get(key)
        if found is None:
            found = self._seen[key] = self._read(response)
        return found

    @staticmethod
    def _read(response: Any) -> tuple[list[str], list[str]]:
        refs: set[str] = set()
        secrets: set[str] = set()
        for packed in response.resources:
            if response.type_url == CLUSTER:
                cluster = cluster_pb2.Cluster()
                packed.Unpack(cluster)
                eds = references.eds_service_name(cluster)
                if eds is not None:
                    refs.add(eds)
                secrets.update(references.cluster_secret_names(cluster))
            else:
                listener = listener_pb2.Listener()
                packed.Unpack(listener)
                refs.update(references.route_config_names(listener))
                secrets.update(references.listener_secret_names(listener))
        return sorted(refs), sorted(secrets)


ChannelOf = Callable[[int], grpc.aio.Channel]  # stream index -> a new channel for it
Watcher = Callable[[int, Any], None]  # (stream index, a response it received)


class Fleet:
    """N streams to one server; see the module docstring.

    By default a stream is the benchmark's proxy ``i`` (:func:`bench.xds_mesh.node_id`) on
    insecure channels; ``node_id`` and ``channel_of`` make it another (the soak's proxies
    each have a certificate and a connection of their own), and ``watch`` sees every
    response a synced stream receives, before it is ACKed."""

    def __init__(
        self,
        target: str,
        streams: int,
        groups: int,
        per_channel: int,
        *,
        node_id: Callable[[int], str] | None = None,
        channel_of: ChannelOf | None = None,
        watch: Watcher | None = None,
    ) -> None:
        self.target = target
        self.size = streams
        self.groups = groups
        self.per_channel = per_channel
        self._node_id = node_id or (lambda i: xds_mesh.node_id(i, groups))
        self._channel_of = channel_of or (
            lambda i: grpc.aio.insecure_channel(target, CHANNEL_OPTIONS)
        )
        self._watch = watch
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._names = _Names()
        self._synced = 0
        self._all_synced = asyncio.Event()
        self._failure: BaseException | None = None
        # the current round
        self._round = 0
        self._start = 0.0
        self._latencies: list[float] = []
        self._seen: list[int] = [0] * streams  # the last round each stream ACKed EDS in
        self._done = asyncio.Event()
        self.responses: Counter[str] = Counter()  # responses received in the round, by type
        self.duplicates = 0
        self.retries = 0  # streams that failed before they were synced, and were reopened
        self.retry_reason: BaseException | None = None

    async def connect(self, count: int, timeout: float) -> float:
        """Open ``count`` more streams at once and wait until every stream is synced;
        return the wall time."""
        start = time.monotonic()
        opened = len(self._tasks)
        for i in range(opened, min(opened + count, self.size)):
            if i // self.per_channel == len(self._channels):
                channel = self._channel_of(i)
                self._channels.append(channel)
                self._stubs.append(ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel))
            self._tasks.append(asyncio.create_task(self._stream(i)))
        self._all_synced.clear()
        if self._synced == len(self._tasks):
            self._all_synced.set()
        await self._until(self._all_synced, timeout, lambda: f"{self._synced} synced")
        return time.monotonic() - start

    @property
    def failure(self) -> BaseException | None:
        """The first failure of a stream after it was synced (streams are not reopened)."""
        return self._failure

    @property
    def started(self) -> float:
        """When the current round began (:func:`time.monotonic`, one clock for every process
        on the machine: a round triggered by another process is timed from its own start)."""
        return self._start

    def begin(self, round_: int) -> None:
        """Start round ``round_`` now (call right before triggering the change)."""
        self._round = round_
        self._latencies = []
        self.responses = Counter()
        self.duplicates = 0
        self._done.clear()
        self._start = time.monotonic()

    async def wait(self, timeout: float) -> list[float]:
        """Seconds from :meth:`begin` to each stream's ACK of the round's EDS push."""
        await self._until(self._done, timeout, lambda: f"{len(self._latencies)} ACKed")
        return self._latencies

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for channel in self._channels:
            await channel.close()

    async def _until(self, event: asyncio.Event, timeout: float, state: Callable[[], str]) -> None:
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"{self.target}: not done after {timeout:g} s ({state()} of {self.size})"
            ) from None
        if self._failure is not None:
            raise RuntimeError(f"{self.target}: a stream failed: {self._failure!r}")

    async def _stream(self, index: int) -> None:
        call: Any = None
        try:
            call, names = await self._open(index)
            self._synced += 1
            if self._synced == len(self._tasks):
                self._all_synced.set()
            await self._follow(index, call, names)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if self._failure is None:
                self._failure = await _explained(index, call, exc)
            self._all_synced.set()
            self._done.set()

    async def _open(self, index: int) -> tuple[Any, dict[str, list[str]]]:
        """Open the stream and sync it; retry as Envoy does, with jittered exponential
        backoff, when the stream fails before it is synced."""
        stub = self._stubs[index // self.per_channel]
        for attempt in range(SYNC_ATTEMPTS):
            call = stub.StreamAggregatedResources()
            try:
                return call, await self._sync(index, call)
            except grpc.aio.AioRpcError as exc:
                self.retries += 1
                if self.retry_reason is None:
                    self.retry_reason = await _explained(index, call, exc)
                call.cancel()
                if attempt + 1 == SYNC_ATTEMPTS:
                    raise
                await asyncio.sleep(random.uniform(0, RETRY_BASE * 2**attempt))
        raise AssertionError("unreachable")

    async def _sync(self, index: int, call: Any) -> dict[str, list[str]]:
        """Walk the protocol up to the SDS ACK; return the names subscribed to, by type."""
        node = base_pb2.Node(id=self._node_id(index), cluster="bench", metadata=NODE_METADATA)
        await call.write(discovery_pb2.DiscoveryRequest(node=node, type_url=CLUSTER))
        cds = await _read(call, CLUSTER)
        eds_names, cluster_secrets = self._names.of(cds)
        await call.write(
            discovery_pb2.DiscoveryRequest(type_url=ENDPOINT, resource_names=eds_names)
        )
        await _ack(call, cds, [])
        await _ack(call, await _read(call, ENDPOINT), eds_names)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=LISTENER))
        lds = await _read(call, LISTENER)
        rds_names, listener_secrets = self._names.of(lds)
        await call.write(discovery_pb2.DiscoveryRequest(type_url=ROUTE, resource_names=rds_names))
        await _ack(call, lds, [])
        await _ack(call, await _read(call, ROUTE), rds_names)
        sds_names = sorted({*cluster_secrets, *listener_secrets})
        await call.write(discovery_pb2.DiscoveryRequest(type_url=SECRET, resource_names=sds_names))
        await _ack(call, await _read(call, SECRET), sds_names)
        return {ENDPOINT: eds_names, ROUTE: rds_names, SECRET: sds_names}

    async def _follow(self, index: int, call: Any, names: dict[str, list[str]]) -> None:
        """ACK every push; note when the round's EDS push was ACKed."""
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                raise RuntimeError(f"stream {index} ended by the server")
            if self._watch is not None:
                self._watch(index, response)
            await _ack(call, response, names.get(response.type_url, []))
            now = time.monotonic()
            self.responses[response.type_url] += 1
            if response.type_url != ENDPOINT:
                continue
            if self._seen[index] == self._round:
                self.duplicates += 1
                continue
            self._seen[index] = self._round
            self._latencies.append(now - self._start)
            if len(self._latencies) == self.size:
                self._done.set()


async def _read(call: Any, type_url: TypeUrl) -> Any:
    response = await call.read()
    if response is grpc.aio.EOF:
        raise RuntimeError(f"the stream ended while waiting for {type_url}")
    if response.type_url != type_url:
        raise RuntimeError(f"expected a {type_url} response, got {response.type_url}")
    return response


async def _ack(call: Any, response: Any, names: list[str]) -> None:
    await call.write(
        discovery_pb2.DiscoveryRequest(
            type_url=response.type_url,
            version_info=response.version_info,
            response_nonce=response.nonce,
            resource_names=names,
        )
    )


async def _explained(index: int, call: Any, exc: BaseException) -> BaseException:
    """``exc`` with the stream's own status: grpc.aio reports a write that failed because
    the server had ended the stream as INTERNAL ("Internal error from Core")."""
    if call is None or not isinstance(exc, grpc.aio.AioRpcError):
        return exc
    try:
        code, details = await asyncio.wait_for(call.code(), 5), await call.details()
    except Exception:
        return exc
    return RuntimeError(f"stream {index} ended with {code.name}: {details} ({exc.details()})")
