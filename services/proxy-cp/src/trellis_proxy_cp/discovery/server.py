"""The Linkerd Destination API: ``io.linkerd.proxy.destination.Destination`` (``Get``,
``GetProfile``; linkerd2-proxy-api v0.18.0) and the conduit-era
``conduit.proxy.destination.Destination`` (``Get``), served from the catalog's destinations
(:mod:`.clients.destinations`) on their own mTLS port (8086 by default).

Who may ask, and about what (:mod:`.access`): a proxy, identified by its certificate as on
xDS (the TLS handshake requires one from the mesh CA; a proxy certificate of ``trellis vm
bootstrap``, CN only, is enough; its serial must be current and not revoked, and the catalog
must expect the proxy), about the destinations its identity's view reaches: its outbound
services, their route and split backends, and the ServiceEntries it may reach. Anything
else a destination owns (by name, host, service address or endpoint address) is refused
PERMISSION_DENIED, naming the caller and the destination (reason ``not_reachable``); a
stream open on a destination that its caller's view stops reaching is ended the same way.
A name or address nothing owns is answered, as ever, ``exists: false``. Every refusal is
logged (``destination.refused``) and counted by reason (``not_reachable``, ``revoked``,
``not_expected``, ``stale_serial``, ``catalog_unavailable``, ``invalid_authority``,
``overflow``...).

Each stream follows the discipline of Linkerd's own server: it watches what it resolved in
the table, which puts a tick on the stream's bounded queue at every change, and a writer
sends the difference between what the client has and what is true now. A client too slow to
read lets its queue overflow; that ends its stream (RESOURCE_EXHAUSTED, logged and counted)
and never blocks the table or the other streams. ``Get`` sends, in order:

* first: ``add`` with every endpoint, or ``no_endpoints{exists:true}`` for a service with
  none, or ``no_endpoints{exists:false}`` for one that does not exist (the seed's rule; modern
  Linkerd answers NOT_FOUND instead: docs/linkerd.md says why we keep the seed's) and for a
  ServiceEntry whose hosts are resolved by DNS (or not at all), so the client falls back to
  DNS rather than black-holing its traffic;
* then: ``add`` of what came or changed, then ``remove`` of what went (make before break:
  a workload whose address is replaced is never missing); ``no_endpoints`` with
  ``exists:true`` when the last endpoint goes, ``exists:false`` when the service goes.

Names follow upstream's ``parseK8sServiceName``: ``Get`` and ``GetProfile`` answer
``<service>.<namespace>.svc.<cluster-domain>`` and ``<instance>.<service>...`` (one
endpoint: a pod, a StatefulSet pod's DNS name, a VM workload), and, beyond upstream, the
hosts of ServiceEntries; any other name is refused INVALID_ARGUMENT. ``Get`` refuses an IP
address INVALID_ARGUMENT, as upstream's ("IP queries not supported by Get API");
``GetProfile`` answers one (a service address, or an endpoint's own profile). The conduit
API keeps answering both, as it always has.

The conduit API gets the same from the same watchers, in its own messages, plus an empty
``add`` whenever ADDRESS_UPDATE_INTERVAL passes without an update (its seed's liveness rule).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

from trellis_api import catalog_pb2 as cpb
from trellis_api.conduit.common import common_pb2 as conduit_common
from trellis_api.conduit.proxy.destination import destination_pb2 as conduit
from trellis_api.conduit.proxy.destination import destination_pb2_grpc as conduit_grpc
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import destination_pb2_grpc as dpb_grpc
from trellis_proxy_cp.authorizer import peer_common_name
from trellis_proxy_cp.clients.destinations import EVERYTHING, DestinationTable
from trellis_proxy_cp.discovery.access import Access, Caller, ViewUnavailable
from trellis_proxy_cp.discovery.updates import NOTHING, Resolved, get_updates, to_conduit
from trellis_proxy_cp.translate import linkerd
from trellis_proxy_cp.transport.streams import StreamRefused
from trellis_runtime.health import Rejections
from trellis_runtime.metrics import MetricFactory

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
LINKERD_SERVICE = dpb.DESCRIPTOR.services_by_name["Destination"].full_name
CONDUIT_SERVICE = conduit.DESCRIPTOR.services_by_name["Destination"].full_name
#: Names whose resolution is kept for the streams of the same table generation.
RESOLVED_CACHE = 10_000
#: A stream's step: the messages that bring its client up to date (``hidden``: to nothing).
Step = Callable[[bool], list[Any]]
#: A stream's check before each step: hide what it asked for? (raises StreamRefused)
Gate = Callable[[], Awaitable[bool]]


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


class DiscoveryMetrics:
    def __init__(self, make: MetricFactory) -> None:
        self.streams = make.gauge("destination_streams", "Open Destination API streams", "rpc")
        self.opened = make.counter("destination_streams_opened", "Destination API streams", "rpc")
        self.updates = make.counter("destination_updates", "Destination API messages sent", "rpc")
        self.refused = make.counter(
            "destination_refused",
            "Destination API requests refused or streams ended, by code and reason "
            "(not_reachable, invalid_authority, overflow, catalog_unavailable, and the "
            "caller's certificate's: revoked, not_expected, stale_serial...)",
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
        access: Access,
        rejections: Rejections | None = None,
    ) -> None:
        self.table = table
        self.options = options
        self.metrics = metrics
        self.access = access
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

    async def admit(
        self, context: Context, path: str, rpc: str = ""
    ) -> tuple[Caller, linkerd.Authority]:
        """Who asks (checked as an xDS stream's proxy is), and what it names (``rpc``:
        ``Get`` or ``GetProfile``, whose names are checked as upstream's: :meth:`check`)."""
        try:
            caller = await self.access.identify(context)
        except StreamRefused as refused:
            await self.refuse(context, refused.code, refused.reason, refused.message)
        try:
            target = linkerd.parse_authority(path, self.options.cluster_domain)
            if rpc:
                self.check(target, rpc)
            return caller, target
        except linkerd.InvalidAuthority as exc:
            await self.refuse(
                context, grpc.StatusCode.INVALID_ARGUMENT, "invalid_authority", str(exc)
            )

    def check(self, target: linkerd.Authority, rpc: str) -> None:
        """Upstream's rules for what the Linkerd API's ``rpc`` may name: ``Get`` no IP
        address; neither a name outside the cluster domain, unless it is a ServiceEntry's
        host (raises InvalidAuthority)."""
        if target.ip:
            if rpc == "Get":
                raise linkerd.InvalidAuthority(
                    f"IP queries not supported by Get API: host={target.ip} "
                    "(ask GetProfile for an address)"
                )
            return
        if not target.service and self.table.by_host(target.host) is None:
            domain = self.options.cluster_domain
            raise linkerd.InvalidAuthority(
                f"invalid authority {target}: not <service>.<namespace>.svc.{domain} "
                f"(nor <instance>.<service>.<namespace>.svc.{domain}), nor a ServiceEntry host"
            )

    # -- resolution ----------------------------------------------------------------------

    def destination(self, target: linkerd.Authority) -> cpb.Destination | None:
        if target.ip:
            return self.table.by_address(target.ip)
        found = self.table.by_host(target.host)  # a ServiceEntry host first
        if found is None and target.service:
            found = self.table.get(f"{target.namespace}/{target.service}")
        return found

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
            owner = f"{found.namespace}/{found.name}"
            if target.instance and not linkerd.is_service_entry(found):
                one = linkerd.instance_addresses(found, target.port, target.instance, domain)
                return Resolved(True, one, owner)
            cluster = linkerd.port_cluster(found, target.port)
            is_entry = linkerd.is_service_entry(found)
            if cluster is None and is_entry:
                return Resolved(False, {}, owner)  # not one of its ports: DNS decides
            if cluster is not None and is_entry and linkerd.without_ip(cluster):
                return Resolved(False, {}, owner)  # let the client resolve it by DNS
            return Resolved(True, linkerd.addresses(found, target.port, domain), owner)
        if target.ip:
            hit = linkerd.find_endpoint(self.table.destinations(), target.ip, target.port)
            if hit is not None:
                destination, cluster, endpoint = hit
                key = (target.ip, target.port)
                addr = linkerd.weighted_addr(destination, cluster, endpoint, key, domain)
                owner = f"{destination.namespace}/{destination.name}"
                return Resolved(True, {key: addr}, owner)
        return NOTHING

    def profile(self, target: linkerd.Authority, hidden: bool = False) -> dpb.DestinationProfile:
        """The profile of ``target``; ``hidden``: of nothing (the caller may not reach it)."""
        options = self.options
        if hidden:
            return linkerd.profile(None, target.port, options.budget, options.cluster_domain)
        found = self.destination(target)
        if found is not None and target.instance and not linkerd.is_service_entry(found):
            # upstream: a pod's DNS name gets that endpoint's profile
            cluster = linkerd.port_cluster(found, target.port)
            one = linkerd.instance_addresses(
                found, target.port, target.instance, options.cluster_domain
            )
            if cluster is None or not one:
                return linkerd.profile(None, target.port, options.budget, options.cluster_domain)
            [addr] = list(one.values())[:1]
            return linkerd.endpoint_profile(addr, found, cluster, options.budget)
        if found is None and target.ip:
            hit = linkerd.find_endpoint(self.table.destinations(), target.ip, target.port)
            if hit is not None:
                destination, cluster, endpoint = hit
                key = (target.ip, target.port)
                addr = linkerd.weighted_addr(
                    destination, cluster, endpoint, key, options.cluster_domain
                )
                return linkerd.endpoint_profile(addr, destination, cluster, options.budget)
        return linkerd.profile(found, target.port, options.budget, options.cluster_domain)

    def labels(self, target: linkerd.Authority) -> dict[str, str]:
        found = self.destination(target)
        return linkerd.set_labels(found.namespace, found.name) if found is not None else {}

    def endpoint_steps(
        self, target: linkerd.Authority, convert: Callable[[dpb.Update], Any] = lambda u: u
    ) -> Step:
        """A ``Get`` stream's step: the updates from what it sent last to what is true now
        (``hidden``: to nothing), each passed through ``convert`` (the conduit API's)."""
        sent: list[Resolved] = []

        def step(hidden: bool) -> list[Any]:
            now = NOTHING if hidden else self.resolve(target)
            updates = get_updates(sent[-1] if sent else None, now, self.labels(target))
            sent[:] = [now]
            return [convert(u) for u in updates]

        return step

    # -- the stream loop -----------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def watching(
        self, rpc: str, target: linkerd.Authority, ticks: Ticks
    ) -> AsyncIterator[None]:
        stop = self.table.watch(self.watch_key(target), ticks)
        self.metrics.opened.labels(rpc).inc()
        self.metrics.streams.labels(rpc).inc()
        try:
            yield
        finally:
            stop()
            self.metrics.streams.labels(rpc).dec()

    async def stream(
        self,
        context: Context,
        rpc: str,
        caller: Caller,
        target: linkerd.Authority,
        step: Step,
        heartbeat: Callable[[], Any] | None = None,
    ) -> None:
        """Send ``step()``'s messages now and after every tick of the table or of the
        caller's view, while the caller may reach ``target`` (:mod:`.access`);
        ``heartbeat()`` when the update interval passes with nothing sent (the conduit
        API's rule). A queue that overflows (the writer is stuck on a client that does not
        read) ends the stream."""
        ticks = Ticks(self.options.queue_capacity)
        try:
            async with (
                self.access.views.following(caller, ticks) as sight,
                self.watching(rpc, target, ticks),
            ):
                gate = functools.partial(
                    sight.hidden, lambda: self.resolve(target).owner, str(target), self.access.fresh
                )
                ended = await self._serve(context, rpc, ticks, gate, step, heartbeat)
        except ViewUnavailable as exc:
            ended = StreamRefused(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot tell what {caller} may reach: the catalog did not answer ({exc}); "
                "retry later",
                "catalog_unavailable",
            )
        await self.refuse(context, ended.code, ended.reason, ended.message)

    async def _serve(
        self,
        context: Context,
        rpc: str,
        ticks: Ticks,
        gate: Gate,
        step: Step,
        heartbeat: Callable[[], Any] | None,
    ) -> StreamRefused:
        """Run the stream's writer until it is refused or its queue overflows."""
        writer = asyncio.create_task(self._write(context, rpc, ticks, gate, step, heartbeat))
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
            error = writer.exception()
            if isinstance(error, StreamRefused):
                return error
            writer.result()  # its error (it never returns)
        return StreamRefused(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"more than {self.options.queue_capacity} updates waited for this client: "
            "it reads too slowly; subscribe again",
            "overflow",
        )

    async def _write(
        self,
        context: Context,
        rpc: str,
        ticks: Ticks,
        gate: Gate,
        step: Step,
        heartbeat: Callable[[], Any] | None,
    ) -> None:
        updates = self.metrics.updates.labels(rpc)
        timeout = self.options.update_interval if heartbeat else None
        while True:
            for message in step(await gate()):
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
        caller, target = await discovery.admit(context, request.path, "Get")
        token = ContextToken.parse(request.context_token)
        log.debug(
            "destination.get peer=%s path=%s ns=%s pod=%s node=%s",
            caller.common_name,
            request.path,
            token.ns,
            token.pod,
            token.node_name,
        )
        await discovery.stream(context, "Get", caller, target, discovery.endpoint_steps(target))

    async def GetProfile(self, request: dpb.GetDestination, context: Context) -> None:  # type: ignore[override]
        discovery = self.discovery
        caller, target = await discovery.admit(context, request.path, "GetProfile")
        sent: list[dpb.DestinationProfile] = []

        def step(hidden: bool) -> list[dpb.DestinationProfile]:
            now = discovery.profile(target, hidden)
            if sent and sent[-1] == now:
                return []
            sent[:] = [now]
            return [now]

        await discovery.stream(context, "GetProfile", caller, target, step)


class ConduitDestination(conduit_grpc.DestinationServicer):
    def __init__(self, discovery: Discovery) -> None:
        self.discovery = discovery

    async def Get(self, request: conduit_common.Destination, context: Context) -> None:  # type: ignore[override]
        discovery = self.discovery
        caller, target = await discovery.admit(context, request.path)
        step = discovery.endpoint_steps(target, to_conduit)

        def heartbeat() -> conduit.Update:
            return conduit.Update(add=conduit.WeightedAddrSet())

        await discovery.stream(context, "conduit.Get", caller, target, step, heartbeat)


def register(discovery: Discovery) -> list[Callable[[grpc.aio.Server], None]]:
    return [
        lambda s: dpb_grpc.add_DestinationServicer_to_server(LinkerdDestination(discovery), s),
        lambda s: conduit_grpc.add_DestinationServicer_to_server(ConduitDestination(discovery), s),
    ]
