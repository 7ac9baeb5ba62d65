"""Following the endpoints providers, whichever are alive: one watch each.

Providers announce themselves in the service registry (kind ``endpoints-provider``).
:class:`ProviderFollower` follows the ``registry`` topic to find them, and watches each
live one on one stream (``WatchServices``): the first answer lists every service, and the
catalog then holds exactly what the provider reports; each later answer carries the
services that changed, as they are now, and those removed, pushed the moment the provider
changes them. A change thus reaches the catalog in one message, with no signal and no
fetch in between (``docs/architecture.md``, "The path of a change"). A watch that ends or
fails is opened again with backoff and starts with a full listing again, so nothing is
missed; meanwhile the provider's loop (``provider <name>``) is down, and its endpoints
stay as they were.

* ``resync("registry")`` discovers the live providers, watches those not watched yet (or
  that moved), and waits for each one's first listing.
* A registry ``up`` of a provider watches it at once: a new provider pod is found with no
  configuration. ``down`` starts its grace period. The sweep (:meth:`ProviderFollower.run`)
  also finds a live provider not watched yet, should its ``up`` have been missed.

Replicas of one provider (``endpoints-vm`` and ``endpoints-vm-2``: the registry names
instances) are one provider (:func:`provider_of`): the catalog watches it through one live
replica, the longest-running, which reports the others' changes too. A replica that dies
or hands over its leadership is no provider leaving: while another replica is in the
registry the provider is live, so a failover costs no grace period and drops no endpoint;
the replica watched next lists in full.

What a provider reports is validated record by record (:mod:`.provider_reports`): a
service or endpoint that fails is rejected with its reason (``/v1/status``, the
``trellis_rejected_records_total`` metric) and skipped; the rest flows.

A provider missing from the registry keeps its endpoints for ``grace`` seconds: a
provider that restarts, or misses a heartbeat while Redis is briefly away, does not make
its services vanish from every proxy. One that stays gone is then dropped. A provider that
crashed rings no ``down`` (its registry key just expires), so :meth:`ProviderFollower.run`
sweeps the registry every ``interval`` seconds for that. Each provider is a health loop
(``provider <name>``), down while it is missing or its watch is failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.clients import provider_reports
from trellis_catalog.clients.provider_reports import InvalidReport, from_proto
from trellis_catalog.domain.index.services import ProvidedService
from trellis_common import components
from trellis_common.backoff import Backoff
from trellis_runtime.events import Follower
from trellis_runtime.follow import describe
from trellis_runtime.health import Health, Loop
from trellis_runtime.registry import REGISTRY_TOPIC, ServiceRecord, discover
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)

KIND = "endpoints-provider"
#: A watch that failed is opened again after this backoff (doubling, jittered, capped).
WATCH_BACKOFF = Backoff(initial=0.1, maximum=5.0, jitter=0.2)


#: A channel to a provider: (address, its kind), so the server's certificate is checked.
KindChannelFactory = Callable[[str, str], grpc.aio.Channel]


def _plaintext(address: str, kind: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address)


PROVIDER_COMPONENTS = ("endpoints-vm", "endpoints-k8s")


def provider_of(instance: str) -> str:
    """The provider an instance's registry name stands for: replicas of one component
    (``endpoints-vm-2``, as ``trellis up --replicas`` and the chart's pods name them) are
    one provider, ``endpoints-vm``, which reports one set of services whichever replica
    answers. Any other name (a provider of another make) is a provider of its own."""
    try:
        component = components.of_instance(instance)
    except components.UnknownComponent:
        return instance
    return component if component in PROVIDER_COMPONENTS else instance


def provider_component(record: ServiceRecord) -> str:
    """The component a provider's server certificate must name: the one its record says,
    if that is an endpoints provider (a record cannot make the catalog trust another)."""
    named = record.attribute("component", "endpoints-vm") or "endpoints-vm"
    return named if named in PROVIDER_COMPONENTS else "endpoints-vm"


@dataclass
class _Provider:
    """One followed provider: where it is, the channel to it, its watch, its health loop."""

    record: ServiceRecord
    channel: grpc.aio.Channel
    stub: pb_grpc.EndpointsProviderAsyncStub
    loop: Loop
    missing_since: float | None = None  # not in the registry since (clock time)
    watch: asyncio.Task[None] | None = None
    #: Set once the current watch answered its first listing, or failed before it did
    #: (``failure``): what a resync waits for.
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    failure: BaseException | None = None
    watching: bool = False  # the current watch listed, and has not failed since


class ProviderFollower(Follower):
    """Keeps every live provider's services in the catalog (see the module docstring)."""

    topics = (REGISTRY_TOPIC,)

    def __init__(
        self,
        catalog: Catalog,
        redis: aioredis.Redis,
        health: Health,
        *,
        grace: float = 30.0,
        interval: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        channel_factory: KindChannelFactory = _plaintext,
    ) -> None:
        super().__init__("endpoints providers")
        self.catalog = catalog
        self.grace = grace
        self.interval = interval
        self._redis = redis
        self._health = health
        self._clock = clock
        self._factory = channel_factory
        self.providers: dict[str, _Provider] = {}
        self._closing: set[asyncio.Task[None]] = set()
        # Signals, resyncs and the sweep each read then change ``providers``: one at a time
        # (the watches apply what they hear without it: the catalog's inputs take no await).
        self._lock = asyncio.Lock()
        self._converted = provider_reports.converted()

    # -- the follower --------------------------------------------------------------------

    async def resync(self, topic: str) -> None:
        """Watch every live provider not watched yet; wait for each one's first listing
        (raises the first failure, once all were tried)."""
        async with self._lock:
            live = await self._discover()
            await self._follow(live.values())

    async def changed(self, event: Event) -> None:
        async with self._lock:
            await self._registry(event)

    async def _registry(self, event: Event) -> None:
        kind, _, name = event.key.partition("/")
        if kind != KIND:
            return
        live = await self._discover()  # a replica leaving is no provider leaving
        found = live.get(provider_of(name))
        if event.kind == "up" and found is not None:  # else it is gone again: the sweep
            await self._follow([found])  # a replica that took over lists it in full

    # -- the registry sweep --------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Every ``interval``: providers that left the registry unannounced start (or end)
        their grace. Closes every provider's channel when ``stop`` ends it."""
        try:
            while not stop.is_set():
                try:
                    await self.sweep()
                except (RedisError, OSError) as exc:  # Redis away: keep what we follow
                    log.warning("providers.sweep_failed error=%s", describe(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval)
        finally:
            if stop.is_set():  # a sweep restarted after a failure keeps what it follows
                for name in list(self.providers):
                    await self._close(name)

    async def sweep(self) -> None:
        """One pass of :meth:`run`: the grace of those gone, and a watch for any live
        provider not watched yet (its registry ``up`` missed), not waited for."""
        async with self._lock:
            live = await self._discover()
            for record in live.values():
                if self._unlisted(record):
                    await self._connect(record)

    # -- helpers -------------------------------------------------------------------------

    async def _discover(self) -> dict[str, ServiceRecord]:
        """The live providers, each by one live replica's record (the one followed, while
        it lives); those followed but not live start or end their grace."""
        live: dict[str, ServiceRecord] = {}
        for record in sorted(await discover(self._redis, KIND), key=_seniority):
            name = provider_of(record.name)
            followed = self.providers.get(name)
            if name not in live or (followed is not None and followed.record.name == record.name):
                live[name] = record
        for name in [n for n in self.providers if n not in live]:
            self._missing(name)
        now = self._clock()
        for name, provider in list(self.providers.items()):
            since = provider.missing_since
            if since is not None and now - since >= self.grace and name not in live:
                log.warning("provider.gone provider=%s after_s=%.0f", name, now - since)
                self.catalog.drop_provider(name)
                self._health.rejections.accept_all(_source(name), set())
                await self._close(name)
        return live

    def _unlisted(self, record: ServiceRecord) -> bool:
        known = self.providers.get(provider_of(record.name))
        return (
            known is None
            or known.missing_since is not None
            or known.record.grpc_address != record.grpc_address
            or known.record.name != record.name  # another replica took over
        )

    def _missing(self, name: str) -> None:
        provider = self.providers.get(name)
        if provider is None or provider.missing_since is not None:
            return
        provider.missing_since = self._clock()
        log.warning("provider.missing provider=%s grace_s=%.0f", name, self.grace)
        provider.loop.down(f"not in the registry; its endpoints are kept for {self.grace:g}s")

    async def _follow(self, records: Iterable[ServiceRecord]) -> None:
        """Watch each provider of ``records`` (again, where it moved or another replica
        took over) and wait for each watch's first listing; raise the first failure."""
        followed = [await self._connect(record) for record in list(records)]
        for provider in followed:
            await provider.settled.wait()
        failed = next((p.failure for p in followed if p.failure is not None), None)
        if failed is not None:
            raise failed

    def _start_watch(self, name: str, provider: _Provider) -> None:
        if provider.watch is not None:
            provider.watch.cancel()
        provider.settled.clear()
        provider.failure = None
        provider.watching = False
        provider.watch = asyncio.get_running_loop().create_task(
            self._watch(name, provider), name=f"watch {name}"
        )

    async def _watch(self, name: str, provider: _Provider) -> None:
        """Watch ``provider`` until cancelled; each failure is logged, shown on its loop,
        and followed by a new watch after a backoff."""
        failures = 0
        while True:
            try:
                call = provider.stub.WatchServices(pb.ListServicesRequest())
                try:
                    async for answer in call:
                        if answer.full:
                            self._listed(name, provider, answer)
                            provider.failure, provider.watching = None, True
                            provider.settled.set()
                        else:
                            self._changed(name, answer)
                        failures = 0
                finally:
                    call.cancel()
                error: Exception = ConnectionResetError("the watch ended")
            except Exception as exc:  # noqa: BLE001 (a watch outlives any one failure)
                error = exc
            if not provider.settled.is_set():
                provider.failure = error
            failures += 1
            provider.watching = False
            provider.loop.down(describe(error))
            provider.settled.set()
            delay = WATCH_BACKOFF.delay(failures)
            expected = isinstance(error, grpc.aio.AioRpcError | OSError)  # the peer went away
            log.log(
                logging.WARNING if expected else logging.ERROR,
                "provider.watch_lost provider=%s instance=%s reason=%r retry_in=%.2fs",
                name,
                provider.record.name,
                describe(error),
                delay,
                exc_info=not expected,
            )
            await asyncio.sleep(delay)
            provider.settled.clear()

    def _listed(self, name: str, provider: _Provider, listed: pb.ServiceChanges) -> None:
        """A watch's first answer: every service the provider knows."""
        accepted = [
            report
            for report in (self._convert(name, m) for m in listed.services)
            if report is not None
        ]
        # rejections of services no longer listed are history, and so are their endpoints
        keys = {(m.info.service.namespace, m.info.service.name) for m in listed.services}
        self._health.rejections.accept_all(_source(name), {f"{n}/{k}" for n, k in keys})
        self._forget_unlisted(name, keys)
        self.catalog.set_provider_services(name, accepted)
        provider.missing_since = None
        provider.loop.up()
        log.info(
            "provider.synced provider=%s instance=%s services=%d rejected=%d",
            name,
            provider.record.name,
            len(accepted),
            len(listed.services) - len(accepted),
        )

    def _changed(self, name: str, answer: pb.ServiceChanges) -> None:
        """A watch's later answer: services as they are now, and those removed."""
        for message in answer.services:
            ref = message.info.service
            # a report that fails validation is no longer the service's truth either
            self.catalog.update_provider_service(
                name, ref.namespace, ref.name, self._convert(name, message)
            )
            log.debug(
                "provider.service_changed provider=%s service=%s/%s endpoints=%d",
                name,
                ref.namespace,
                ref.name,
                len(message.endpoints),
            )
        for ref in answer.removed:
            key = f"{ref.namespace}/{ref.name}"
            self._health.rejections.accept(_source(name), key)
            self.catalog.remove_provider_service(name, ref.namespace, ref.name)
            self._converted.forget((name, ref.namespace, ref.name))
            log.debug("provider.service_removed provider=%s service=%s", name, key)

    async def _connect(self, record: ServiceRecord) -> _Provider:
        """The provider of ``record``, with one channel to its current address and a
        watch on it (a new one where the provider moved or another replica took over)."""
        name = provider_of(record.name)
        known = self.providers.get(name)
        if known is not None and known.record.grpc_address == record.grpc_address:
            taken_over = known.record.name != record.name
            known.record = record
            if taken_over or known.watch is None or known.watch.done():
                self._start_watch(name, known)
            elif known.missing_since is not None and known.watching:
                known.missing_since = None  # back in the registry, its watch never broke
                known.loop.up()
            return known
        if known is not None:
            log.info(
                "provider.moved provider=%s instance=%s address=%s",
                name,
                record.name,
                record.grpc_address,
            )
            if known.watch is not None:
                known.watch.cancel()
            await known.channel.close()
            loop = known.loop
        else:
            log.info(
                "provider.found provider=%s instance=%s address=%s",
                name,
                record.name,
                record.grpc_address,
            )
            loop = self._health.loops.register(_source(name))
        channel = self._factory(record.grpc_address, provider_component(record))
        provider = _Provider(record, channel, pb_grpc.EndpointsProviderStub(channel), loop)
        self.providers[name] = provider
        self._start_watch(name, provider)
        return provider

    def renewed(self) -> None:
        """This component's certificate was renewed: new channels present the new one (the
        old ones are closed once their calls had a moment to finish)."""
        for name, provider in self.providers.items():
            old = provider.channel
            provider.channel = self._factory(
                provider.record.grpc_address, provider_component(provider.record)
            )
            provider.stub = pb_grpc.EndpointsProviderStub(provider.channel)
            self._start_watch(name, provider)  # on the new channel, from a full listing
            closing = asyncio.get_running_loop().create_task(old.close(grace=1.0))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _forget_unlisted(self, provider: str, listed: set[tuple[str, str]]) -> None:
        self._converted.retain(lambda c: c[0] != provider or (c[1], c[2]) in listed)

    async def _close(self, name: str) -> None:
        provider = self.providers.pop(name, None)
        self._converted.retain(lambda c: c[0] != name)
        if provider is not None:
            if provider.watch is not None:
                provider.watch.cancel()
            provider.loop.close()
            await provider.channel.close()

    def _convert(self, provider: str, message: pb.ServiceEndpoints) -> ProvidedService | None:
        ref = message.info.service
        key = f"{ref.namespace}/{ref.name}"
        bad: list[str] = []
        try:
            report = from_proto(provider, message, bad.append, self._converted)
        except InvalidReport as exc:
            self._health.rejections.reject(_source(provider), key, str(exc))
            return None
        if bad:
            self._health.rejections.reject(_source(provider), key, "; ".join(bad))
        else:
            self._health.rejections.accept(_source(provider), key)
        return report


def _seniority(record: ServiceRecord) -> tuple[float, str]:
    """The longest-running replica first: the one a provider is followed through."""
    return (record.started_at, record.name)


def _source(provider: str) -> str:
    return f"provider {provider}"
