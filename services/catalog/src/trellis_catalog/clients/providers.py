"""Following the endpoints providers, whichever are alive, on the one event path.

Providers announce themselves in the service registry (kind ``endpoints-provider``) and
signal each change of a service on the ``endpoints`` topic (key ``<namespace>/<key>``,
sender: the provider's registry name). :class:`ProviderFollower` is the catalog's one
follower of both topics:

* ``resync("endpoints")`` discovers the live providers and lists every one of them
  (``ListServices``): the catalog then holds exactly what each reports.
  ``resync("registry")`` lists only the providers it did not follow yet (or that moved).
* An ``endpoints`` signal fetches that one service (``GetService``) from the provider that
  sent it; NOT_FOUND means the service is gone. A signal from a provider not followed yet
  lists that provider in full.
* A registry ``up`` of a provider lists it at once: a new provider pod is found with no
  configuration. ``down`` starts its grace period.

Replicas of one provider (``endpoints-vm`` and ``endpoints-vm-2``: the registry names
instances) are one provider (:func:`provider_of`): the catalog follows it through one live
replica, the longest-running, and a signal from any replica fetches from the one followed.
A replica that dies or hands over its leadership is no provider leaving: while another
replica is in the registry the provider is live, so a failover costs no grace period and
drops no endpoint; the replica followed next is listed in full.

What a provider reports is validated record by record (:mod:`.provider_reports`): a
service or endpoint that fails is rejected with its reason (``/v1/status``, the
``trellis_rejected_records_total`` metric) and skipped; the rest flows.

A provider missing from the registry keeps its endpoints for ``grace`` seconds: a
provider that restarts, or misses a heartbeat while Redis is briefly away, does not make
its services vanish from every proxy. One that stays gone is then dropped. A provider that
crashed rings no ``down`` (its registry key just expires), so :meth:`ProviderFollower.run`
sweeps the registry every ``interval`` seconds for that, and for nothing else. Each
provider is a health loop (``provider <name>``), down while it is missing or failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

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
from trellis_runtime.events import Follower
from trellis_runtime.follow import describe
from trellis_runtime.health import Health, Loop
from trellis_runtime.registry import REGISTRY_TOPIC, ServiceRecord, discover
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)

KIND = "endpoints-provider"
#: The providers' topic (kinds ``changed``, ``removed``; key ``<namespace>/<service key>``).
TOPIC = "endpoints"


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
    """One followed provider: where it is, the channel to it, its health loop."""

    record: ServiceRecord
    channel: grpc.aio.Channel
    stub: pb_grpc.EndpointsProviderAsyncStub
    loop: Loop
    missing_since: float | None = None  # not in the registry since (clock time)


class ProviderFollower(Follower):
    """Keeps every live provider's services in the catalog (see the module docstring)."""

    topics = (TOPIC, REGISTRY_TOPIC)

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
        # Signals, resyncs and the sweep each read then change ``providers``: one at a time.
        self._lock = asyncio.Lock()
        self._converted = provider_reports.converted()

    # -- the follower --------------------------------------------------------------------

    async def resync(self, topic: str) -> None:
        async with self._lock:
            live = await self._discover()
            if topic == TOPIC:
                await self._list(live.values())
            else:
                await self._list(r for r in live.values() if self._unlisted(r))

    async def changed(self, event: Event) -> None:
        await self.changed_all([event])

    async def changed_all(self, events: Sequence[Event]) -> None:
        """Registry signals in order; between them, each service signalled is fetched once
        (however many signals named it), all of them concurrently."""
        async with self._lock:
            services: dict[tuple[str, str], Event] = {}
            for event in events:
                if event.topic == REGISTRY_TOPIC:
                    await self._fetch_all(services.values())
                    services = {}
                    await self._registry(event)
                else:
                    services[(provider_of(event.sender), event.key)] = event
            await self._fetch_all(services.values())

    async def _fetch_all(self, events: Iterable[Event]) -> None:
        pending = list(events)
        for event in [e for e in pending if provider_of(e.sender) not in self.providers]:
            await self._service(event)  # lists an unknown provider: once, not concurrently
        known = [e for e in pending if provider_of(e.sender) in self.providers]
        results = await asyncio.gather(*map(self._service, known), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _registry(self, event: Event) -> None:
        kind, _, name = event.key.partition("/")
        if kind != KIND:
            return
        live = await self._discover()  # a replica leaving is no provider leaving
        found = live.get(provider_of(name))
        if event.kind == "up" and found is not None:  # else it is gone again: the sweep
            await self._list([found])  # a replica that took over lists it in full

    async def _service(self, event: Event) -> None:
        name = provider_of(event.sender)
        namespace, slash, key = event.key.partition("/")
        if not slash:
            self._health.rejections.reject(
                _source(name), event.key, "a signal's key is not '<namespace>/<service key>'"
            )
            return
        provider = self.providers.get(name)
        if provider is None:
            found = (await self._discover()).get(name)
            if found is None:
                # its registry ``up`` is still on its way, and lists it in full
                log.info("provider.unknown provider=%s service=%s", name, event.key)
            else:
                await self._list([found])
            return
        ref = pb.ServiceRef(namespace=namespace, name=key)
        try:
            message = await provider.stub.GetService(pb.GetServiceRequest(service=ref), timeout=10)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                provider.loop.down(describe(exc))
                raise
            self._health.rejections.accept(_source(name), event.key)
            self.catalog.remove_provider_service(name, namespace, key)
            self._converted.forget((name, namespace, key))
            log.debug("provider.service_removed provider=%s service=%s", name, event.key)
            return
        if message.info.service != ref:
            answered = f"{message.info.service.namespace}/{message.info.service.name}"
            self._health.rejections.reject(
                _source(name), event.key, f"asked for {event.key}, the provider answered {answered}"
            )
            return
        # a report that fails validation is no longer the service's truth either: removed
        self.catalog.update_provider_service(name, namespace, key, self._convert(name, message))
        log.debug(
            "provider.service_fetched provider=%s service=%s endpoints=%d",
            name,
            event.key,
            len(message.endpoints),
        )

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
        """One pass of :meth:`run`."""
        async with self._lock:
            await self._discover()

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

    async def _list(self, records: Iterable[ServiceRecord]) -> None:
        """List each provider in full; raise the first failure once all were tried."""
        failed: grpc.aio.AioRpcError | None = None
        for record in list(records):
            name = provider_of(record.name)
            provider = await self._connect(record)
            try:
                listed = await provider.stub.ListServices(pb.ListServicesRequest(), timeout=30)
            except grpc.aio.AioRpcError as exc:
                provider.loop.down(describe(exc))
                log.warning(
                    "provider.list_failed provider=%s instance=%s error=%s",
                    name,
                    record.name,
                    describe(exc),
                )
                failed = failed or exc
                continue
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
                record.name,
                len(accepted),
                len(listed.services) - len(accepted),
            )
        if failed is not None:
            raise failed

    async def _connect(self, record: ServiceRecord) -> _Provider:
        """The provider of ``record``, with one channel to its current address."""
        name = provider_of(record.name)
        known = self.providers.get(name)
        if known is not None and known.record.grpc_address == record.grpc_address:
            known.record = record
            return known
        if known is not None:
            log.info(
                "provider.moved provider=%s instance=%s address=%s",
                name,
                record.name,
                record.grpc_address,
            )
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
        return provider

    def renewed(self) -> None:
        """This component's certificate was renewed: new channels present the new one (the
        old ones are closed once their calls had a moment to finish)."""
        for provider in self.providers.values():
            old = provider.channel
            provider.channel = self._factory(
                provider.record.grpc_address, provider_component(provider.record)
            )
            provider.stub = pb_grpc.EndpointsProviderStub(provider.channel)
            closing = asyncio.get_running_loop().create_task(old.close(grace=1.0))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _forget_unlisted(self, provider: str, listed: set[tuple[str, str]]) -> None:
        self._converted.retain(lambda c: c[0] != provider or (c[1], c[2]) in listed)

    async def _close(self, name: str) -> None:
        provider = self.providers.pop(name, None)
        self._converted.retain(lambda c: c[0] != name)
        if provider is not None:
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
