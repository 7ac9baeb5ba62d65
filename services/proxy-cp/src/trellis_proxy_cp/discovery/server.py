"""The Linkerd Destination API: ``io.linkerd.proxy.destination.Destination`` (``Get``,
``GetProfile``; linkerd2-proxy-api v0.18.0) and the conduit-era
``conduit.proxy.destination.Destination`` (``Get``), served from the catalog's destinations
(:mod:`.clients.destinations`) on their own mTLS port (8086 by default).

Who may ask: any holder of a certificate the mesh CA issued (the TLS handshake requires
one; a proxy certificate of ``trellis vm bootstrap``, CN only, is enough) whose serial is not
revoked. A revoked one is refused PERMISSION_DENIED, logged and counted.

Each stream follows the discipline of Linkerd's own server: it watches what it resolved in
the table, which puts a tick on the stream's bounded queue at every change, and a writer
sends the difference between what the client has and what is true now. A client too slow to
read lets its queue overflow; that ends its stream (RESOURCE_EXHAUSTED, logged and counted)
and never blocks the table or the other streams. ``Get`` sends, in order:

* first: ``add`` with every endpoint, or ``no_endpoints{exists:true}`` for a service with
  none, or ``no_endpoints{exists:false}`` for one that does not exist (the seed's rule; modern
  Linkerd answers NOT_FOUND instead: docs/linkerd.md says why we keep the seed's);
* then: ``remove`` of what went and ``add`` of what came or changed; ``no_endpoints`` with
  ``exists:true`` when the last endpoint goes, ``exists:false`` when the service goes.

The conduit API gets the same from the same watchers, in its own messages, plus an empty
``add`` whenever ADDRESS_UPDATE_INTERVAL passes without an update (its seed's liveness rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

from trellis_api import catalog_pb2 as cpb
from trellis_api.conduit.common import common_pb2 as conduit_common
from trellis_api.conduit.proxy.destination import destination_pb2 as conduit
from trellis_api.conduit.proxy.destination import destination_pb2_grpc as conduit_grpc
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import destination_pb2_grpc as dpb_grpc
from trellis_common.health import Rejections
from trellis_common.metrics import MetricFactory
from trellis_proxy_cp.authorizer import peer_common_name, peer_serial
from trellis_proxy_cp.clients.destinations import EVERYTHING, DestinationTable
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.translate import linkerd

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
LINKERD_SERVICE = dpb.DESCRIPTOR.services_by_name["Destination"].full_name
CONDUIT_SERVICE = conduit.DESCRIPTOR.services_by_name["Destination"].full_name
Addresses = dict[tuple[str, int], dpb.WeightedAddr]
#: Names whose resolution is kept for the streams of the same table generation.
RESOLVED_CACHE = 10_000


@dataclass(frozen=True, slots=True)
class DiscoveryOptions:
    cluster_domain: str = "cluster.local"
    queue_capacity: int = 100
    #: the conduit API's ADDRESS_UPDATE_INTERVAL (seconds)
    update_interval: float = 10.0
    budget: linkerd.RetryBudget = field(default_factory=linkerd.RetryBudget)


@dataclass(frozen=True, slots=True)
class ContextToken:
    """What a client's ``context_token`` says of it (Linkerd's JSON, or ``ns:<namespace>``)."""

    ns: str = ""
    node_name: str = ""
    pod: str = ""

    @classmethod
    def parse(cls, text: str) -> ContextToken:
        if not text.strip():
            return cls()
        try:
            data = json.loads(text)
        except ValueError:
            kind, sep, value = text.strip().partition(":")
            if sep and kind == "ns" and ":" not in value:
                return cls(ns=value)
            log.warning("destination.context_token_unreadable token=%r", text[:200])
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(
            *(str(data.get(k) or "")[:253] for k in ("ns", "nodeName", "pod")),
        )


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a ``Get`` names, now: does it exist, and its addresses."""

    exists: bool
    addresses: Addresses


class Ticks:
    """A stream's bounded queue of "something moved" ticks; the table's watcher."""

    def __init__(self, capacity: int) -> None:
        self.queue: asyncio.Queue[None] = asyncio.Queue(maxsize=capacity)
        self.overflowed = asyncio.Event()

    def __call__(self) -> None:
        try:
            self.queue.put_nowait(None)
        except asyncio.QueueFull:
            self.overflowed.set()

    async def next(self, timeout: float | None = None) -> bool:
        """Wait for a tick, then take every pending one; False if ``timeout`` passed first."""
        try:
            async with asyncio.timeout(timeout):
                await self.queue.get()
        except TimeoutError:
            return False
        while not self.queue.empty():
            self.queue.get_nowait()
        return True


def get_updates(before: Resolved | None, now: Resolved, labels: dict[str, str]) -> list[dpb.Update]:
    """What moves a client from ``before`` (None: nothing sent yet) to ``now``."""
    if before is None:
        if now.addresses:
            return [_add(now.addresses.values(), labels)]
        return [dpb.Update(no_endpoints=dpb.NoEndpoints(exists=now.exists))]
    if not now.exists:
        gone = before.exists or bool(before.addresses)
        return [dpb.Update(no_endpoints=dpb.NoEndpoints(exists=False))] if gone else []
    if not now.addresses:
        if before.addresses or not before.exists:
            return [dpb.Update(no_endpoints=dpb.NoEndpoints(exists=True))]
        return []
    updates = []
    removed = [key for key in before.addresses if key not in now.addresses]
    if removed:
        addrs = [linkerd.tcp_address(ip, port) for ip, port in sorted(removed)]
        updates.append(dpb.Update(remove=dpb.AddrSet(addrs=addrs)))
    added = [a for key, a in sorted(now.addresses.items()) if before.addresses.get(key) != a]
    if added:
        updates.append(_add(added, labels))
    return updates


def _add(addrs: Any, labels: dict[str, str]) -> dpb.Update:
    return dpb.Update(add=dpb.WeightedAddrSet(addrs=list(addrs), metric_labels=labels))


def to_conduit(update: dpb.Update) -> conduit.Update:
    kind = update.WhichOneof("update")
    if kind == "add":
        addrs = [linkerd.conduit_weighted_addr(a) for a in update.add.addrs]
        return conduit.Update(
            add=conduit.WeightedAddrSet(addrs=addrs, metric_labels=update.add.metric_labels)
        )
    if kind == "remove":
        removed = [
            conduit_common.TcpAddress.FromString(a.SerializeToString()) for a in update.remove.addrs
        ]
        return conduit.Update(remove=conduit.AddrSet(addrs=removed))
    return conduit.Update(no_endpoints=conduit.NoEndpoints(exists=update.no_endpoints.exists))


class DiscoveryMetrics:
    def __init__(self, make: MetricFactory) -> None:
        self.streams = make.gauge("destination_streams", "Open Destination API streams", "rpc")
        self.opened = make.counter("destination_streams_opened", "Destination API streams", "rpc")
        self.updates = make.counter("destination_updates", "Destination API messages sent", "rpc")
        self.refused = make.counter(
            "destination_refused",
            "Destination API requests refused or streams ended, by code and reason "
            "(invalid_authority, revoked, overflow)",
            "code",
            "reason",
        )


class Discovery:
    """The resolution and stream loop both APIs share."""

    def __init__(
        self,
        table: DestinationTable,
        options: DiscoveryOptions,
        metrics: DiscoveryMetrics,
        revoked: RevokedSerials | None = None,
        rejections: Rejections | None = None,
    ) -> None:
        self.table = table
        self.options = options
        self.metrics = metrics
        self.revoked = revoked if revoked is not None else RevokedSerials()
        self.rejections = rejections
        self._resolved: dict[linkerd.Authority, tuple[int, Resolved]] = {}

    # -- checks --------------------------------------------------------------------------

    async def refuse(
        self, context: Context, code: grpc.StatusCode, reason: str, detail: str
    ) -> NoReturn:
        peer = peer_common_name(context) or context.peer()
        log.warning("destination.refused peer=%s reason=%s detail=%r", peer, reason, detail)
        self.metrics.refused.labels(code.name, reason).inc()
        if self.rejections is not None:
            self.rejections.reject("destination", reason, f"{peer}: {detail}")
        await context.abort(code, detail)
        raise AssertionError("abort returned")  # pragma: no cover (abort raises)

    async def admit(self, context: Context, path: str) -> linkerd.Authority:
        serial = peer_serial(context)
        if serial and serial in self.revoked:
            await self.refuse(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                "revoked",
                f"the client certificate (serial {serial}) is revoked",
            )
        try:
            return linkerd.parse_authority(path, self.options.cluster_domain)
        except linkerd.InvalidAuthority as exc:
            await self.refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "invalid_authority", str(exc)
            )

    # -- resolution ----------------------------------------------------------------------

    def destination(self, target: linkerd.Authority) -> cpb.Destination | None:
        if target.ip:
            return self.table.by_address(target.ip)
        found = None
        if target.service:
            found = self.table.get(f"{target.namespace}/{target.service}")
        return found if found is not None else self.table.by_host(target.host)

    def watch_key(self, target: linkerd.Authority) -> str:
        if target.service and target.host.endswith(".svc." + self.options.cluster_domain):
            return f"{target.namespace}/{target.service}"
        return EVERYTHING  # an IP, or a host that may resolve to any destination

    def resolve(self, target: linkerd.Authority) -> Resolved:
        """What ``target`` names now; computed once per table change for all the streams
        that ask for the same name (a change wakes them together)."""
        generation = self.table.changes
        cached = self._resolved.get(target)
        if cached is not None and cached[0] == generation:
            return cached[1]
        if len(self._resolved) > RESOLVED_CACHE:
            self._resolved.clear()
        resolved = self._resolve(target)
        self._resolved[target] = (generation, resolved)
        return resolved

    def _resolve(self, target: linkerd.Authority) -> Resolved:
        domain = self.options.cluster_domain
        found = self.destination(target)
        if found is not None:
            return Resolved(True, linkerd.addresses(found, target.port, domain))
        if target.ip:
            hit = linkerd.find_endpoint(self.table.destinations(), target.ip, target.port)
            if hit is not None:
                destination, cluster, endpoint = hit
                key = (target.ip, target.port)
                addr = linkerd.weighted_addr(destination, cluster, endpoint, key, domain)
                return Resolved(True, {key: addr})
        return Resolved(False, {})

    def profile(self, target: linkerd.Authority) -> dpb.DestinationProfile:
        options = self.options
        found = self.destination(target)
        if found is None and target.ip:
            hit = linkerd.find_endpoint(self.table.destinations(), target.ip, target.port)
            if hit is not None:
                destination, cluster, endpoint = hit
                key = (target.ip, target.port)
                addr = linkerd.weighted_addr(
                    destination, cluster, endpoint, key, options.cluster_domain
                )
                return linkerd.endpoint_profile(addr, cluster, options.budget)
        return linkerd.profile(found, target.port, options.budget, options.cluster_domain)

    def labels(self, target: linkerd.Authority) -> dict[str, str]:
        found = self.destination(target)
        return linkerd.set_labels(found.namespace, found.name) if found is not None else {}

    def endpoint_steps(
        self, target: linkerd.Authority, convert: Callable[[dpb.Update], Any] = lambda u: u
    ) -> Callable[[], list[Any]]:
        """A ``Get`` stream's step: the updates from what it sent last to what is true now,
        each passed through ``convert`` (the conduit API's messages)."""
        sent: list[Resolved] = []

        def step() -> list[Any]:
            now = self.resolve(target)
            updates = get_updates(sent[-1] if sent else None, now, self.labels(target))
            sent[:] = [now]
            return [convert(u) for u in updates]

        return step

    # -- the stream loop -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def watching(self, rpc: str, target: linkerd.Authority) -> AsyncIterator[Ticks]:
        ticks = Ticks(self.options.queue_capacity)
        stop = self.table.watch(self.watch_key(target), ticks)
        self.metrics.opened.labels(rpc).inc()
        self.metrics.streams.labels(rpc).inc()
        try:
            yield ticks
        finally:
            stop()
            self.metrics.streams.labels(rpc).dec()

    async def stream(
        self,
        context: Context,
        rpc: str,
        target: linkerd.Authority,
        step: Callable[[], list[Any]],
        heartbeat: Callable[[], Any] | None = None,
    ) -> None:
        """Send ``step()``'s messages now and after every tick; ``heartbeat()`` when the
        update interval passes with nothing sent (the conduit API's rule). A queue that
        overflows (the writer is stuck on a client that does not read) ends the stream."""
        async with self.watching(rpc, target) as ticks:
            writer = asyncio.create_task(self._write(context, rpc, ticks, step, heartbeat))
            overflow = asyncio.create_task(ticks.overflowed.wait())
            try:
                await asyncio.wait({writer, overflow}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                overflow.cancel()
                if not writer.done():
                    writer.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await writer
            if writer.done() and not writer.cancelled():
                writer.result()  # its error, if any
                return
        await self.refuse(
            context,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "overflow",
            f"more than {self.options.queue_capacity} updates waited for this client: "
            "it reads too slowly; subscribe again",
        )

    async def _write(
        self,
        context: Context,
        rpc: str,
        ticks: Ticks,
        step: Callable[[], list[Any]],
        heartbeat: Callable[[], Any] | None,
    ) -> None:
        updates = self.metrics.updates.labels(rpc)
        timeout = self.options.update_interval if heartbeat else None
        while True:
            for message in step():
                await context.write(message)
                updates.inc()
            while not await ticks.next(timeout):
                if heartbeat is not None:
                    await context.write(heartbeat())
                    updates.inc()


class LinkerdDestination(dpb_grpc.DestinationServicer):
    def __init__(self, discovery: Discovery) -> None:
        self.discovery = discovery

    async def Get(self, request: dpb.GetDestination, context: Context) -> None:  # type: ignore[override]
        discovery = self.discovery
        target = await discovery.admit(context, request.path)
        token = ContextToken.parse(request.context_token)
        log.debug(
            "destination.get path=%s ns=%s pod=%s node=%s",
            request.path,
            token.ns,
            token.pod,
            token.node_name,
        )
        await discovery.stream(context, "Get", target, discovery.endpoint_steps(target))

    async def GetProfile(self, request: dpb.GetDestination, context: Context) -> None:  # type: ignore[override]
        discovery = self.discovery
        target = await discovery.admit(context, request.path)
        sent: list[dpb.DestinationProfile] = []

        def step() -> list[dpb.DestinationProfile]:
            now = discovery.profile(target)
            if sent and sent[-1] == now:
                return []
            sent[:] = [now]
            return [now]

        await discovery.stream(context, "GetProfile", target, step)


class ConduitDestination(conduit_grpc.DestinationServicer):
    def __init__(self, discovery: Discovery) -> None:
        self.discovery = discovery

    async def Get(self, request: conduit_common.Destination, context: Context) -> None:  # type: ignore[override]
        discovery = self.discovery
        target = await discovery.admit(context, request.path)
        step = discovery.endpoint_steps(target, to_conduit)

        def heartbeat() -> conduit.Update:
            return conduit.Update(add=conduit.WeightedAddrSet())

        await discovery.stream(context, "conduit.Get", target, step, heartbeat)


def register(discovery: Discovery) -> list[Callable[[grpc.aio.Server], None]]:
    return [
        lambda s: dpb_grpc.add_DestinationServicer_to_server(LinkerdDestination(discovery), s),
        lambda s: conduit_grpc.add_DestinationServicer_to_server(ConduitDestination(discovery), s),
    ]
