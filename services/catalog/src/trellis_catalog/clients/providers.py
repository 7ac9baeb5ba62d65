"""Following the endpoints providers: whichever are alive, each over its watch stream.

Providers announce themselves in the service registry (kind ``endpoints-provider``). For
each live one, a :class:`ProviderFollower` opens ``Watch``, lists everything once it has the
SNAPSHOT (so nothing between the two is missed), then applies each change in order. A
stream that breaks is reopened with backoff and resyncs in full.

What a provider reports is validated here, record by record (:func:`from_proto`): a
service or endpoint that fails is rejected with its reason (``/v1/status``, the
``trellis_rejected_records_total`` metric) and skipped; the rest flows. A provider keys a
ServiceEntry's services by host (``shop/payments.example.com``); the catalog names
services by DNS label, so a host that is not one is mapped to its ServiceEntry
(``shop/payments``), whose hosts it joins.

A provider whose registry entry expires keeps its endpoints for ``grace`` seconds: a
provider that restarts, or misses a heartbeat while Redis is briefly away, does not make
its services vanish from every proxy. One that stays gone is then dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterable, AsyncIterator, Callable

import grpc
import redis.asyncio as aioredis

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.services import ProvidedEndpoint, ProvidedService
from trellis_common import ids
from trellis_common.follow import StreamFollower
from trellis_common.health import Health
from trellis_common.registry import ServiceRecord, discover

log = logging.getLogger(__name__)

KIND = "endpoints-provider"
_LOCATION = {pb.MESH_INTERNAL: "MESH_INTERNAL", pb.MESH_EXTERNAL: "MESH_EXTERNAL"}
_RESOLUTION = {
    pb.STATIC: "STATIC",
    pb.DNS: "DNS",
    pb.DNS_ROUND_ROBIN: "DNS_ROUND_ROBIN",
    pb.NONE: "NONE",
}
_ENTRY = "ServiceEntry "


class InvalidReport(ValueError):
    """A provider's report of one service that the catalog cannot take; says why."""


def service_name(namespace: str, key: str, source: str) -> str:
    """The catalog's name for a provider's service key (a DNS label, or a host)."""
    ids.validate_dns_label(namespace, "service.namespace")
    try:
        return ids.validate_dns_label(key, "service.name")
    except ids.InvalidIdentifier as exc:
        if not source.startswith(_ENTRY):
            raise InvalidReport(str(exc)) from None
    entry_namespace, _, entry = source.removeprefix(_ENTRY).partition("/")
    if entry_namespace != namespace:
        raise InvalidReport(
            f"service {namespace}/{key}: its ServiceEntry {entry_namespace}/{entry} is in "
            "another namespace"
        )
    try:
        return ids.validate_dns_label(entry, "ServiceEntry name")
    except ids.InvalidIdentifier as exc:
        raise InvalidReport(f"service {namespace}/{key}: {exc}") from None


def _endpoint(message: pb.Endpoint, where: str) -> ProvidedEndpoint:
    if message.service_account:
        try:
            ids.validate_dns_subdomain(message.service_account, "endpoint.service_account")
        except ids.InvalidIdentifier as exc:
            raise InvalidReport(f"{where}, endpoint {message.address}: {exc}") from None
    if not message.address:
        raise InvalidReport(f"{where}: an endpoint has no address")
    for name, number in message.ports.items():
        if not 0 < number < 65536:
            raise InvalidReport(
                f"{where}, endpoint {message.address}: port {name!r} is {number}, not in 1-65535"
            )
    return ProvidedEndpoint(
        address=message.address,
        ports=tuple(sorted(message.ports.items())),
        labels=tuple(sorted(message.labels.items())),
        locality=message.locality,
        weight=message.weight,
        service_account=message.service_account,
        workload=message.workload,
    )


def from_proto(
    provider: str, message: pb.ServiceEndpoints, on_bad_endpoint: Callable[[str], None]
) -> ProvidedService:
    """Validate and convert one service's report; raises :class:`InvalidReport`.

    An endpoint that fails is left out (``on_bad_endpoint`` gets the reason); a service
    whose name or ports fail is refused whole.
    """
    info = message.info
    namespace, key = info.service.namespace, info.service.name
    where = f"service {namespace}/{key}"
    try:
        name = service_name(namespace, key, info.source)
    except ids.InvalidIdentifier as exc:
        raise InvalidReport(f"{where}: {exc}") from None
    for port in info.ports:
        if not 0 < port.number < 65536:
            raise InvalidReport(f"{where}: port {port.name!r} is {port.number}, not in 1-65535")
    endpoints = []
    for message_endpoint in message.endpoints:
        try:
            endpoints.append(_endpoint(message_endpoint, where))
        except InvalidReport as exc:
            on_bad_endpoint(str(exc))
    return ProvidedService(
        provider=provider,
        namespace=namespace,
        name=name,
        key=key,
        ports=tuple((p.name, p.number, p.protocol, p.target_port) for p in info.ports),
        endpoints=tuple(endpoints),
        hosts=tuple(info.hosts),
        addresses=tuple(info.addresses),
        location=_LOCATION.get(info.location, "MESH_INTERNAL"),
        resolution=_RESOLUTION.get(info.resolution, "STATIC"),
        export_to=tuple(info.export_to),
        subject_alt_names=tuple(info.subject_alt_names),
        source=info.source,
    )


class ProviderFollower(StreamFollower[pb.EndpointsEvent]):
    """Keeps one provider's services in the catalog while the provider is alive."""

    def __init__(self, catalog: Catalog, record: ServiceRecord, health: Health) -> None:
        super().__init__(f"provider {record.name}", health.loops)
        self.catalog = catalog
        self.record = record
        self.name = record.name
        self._rejections = health.rejections
        self._source = f"provider {record.name}"
        self._stub: pb_grpc.EndpointsProviderAsyncStub | None = None
        self._listed = 0  # the listing's revision: older events are in it
        self._last = 0

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        async with grpc.aio.insecure_channel(self.record.grpc_address) as channel:
            self._stub = pb_grpc.EndpointsProviderStub(channel)
            yield

    def open(self) -> AsyncIterable[pb.EndpointsEvent]:
        assert self._stub is not None
        return self._stub.Watch(pb.WatchRequest())

    async def resync(self, first: pb.EndpointsEvent) -> None:
        assert self._stub is not None
        if first.kind != pb.EndpointsEvent.SNAPSHOT:
            raise RuntimeError(f"provider {self.name} did not start with a SNAPSHOT")
        listed = await self._stub.ListServices(pb.ListServicesRequest(), timeout=30)
        accepted = []
        for message in listed.services:
            report = self._convert(message)
            if report is not None:
                accepted.append(report)
        # rejections of services no longer listed are history
        self._rejections.accept_all(
            self._source, {self._key(m.info.service) for m in listed.services}
        )
        self.catalog.set_provider_services(self.name, accepted)
        self._listed = self._last = listed.revision
        log.info(
            "provider.synced provider=%s services=%d rejected=%d revision=%d",
            self.name,
            len(accepted),
            len(listed.services) - len(accepted),
            listed.revision,
        )

    async def apply(self, event: pb.EndpointsEvent) -> None:
        if event.revision < self._last:
            # Revisions never go backwards (the publisher keeps a floor even when Redis
            # lost its counter); if they do, something reset: trust nothing, resync.
            raise RuntimeError(
                f"provider {self.name}: revision went back from {self._last} to "
                f"{event.revision}; resyncing"
            )
        self._last = event.revision
        if event.revision <= self._listed:
            return  # already in the listing
        key = self._key(event.service)
        if event.kind == pb.EndpointsEvent.CHANGED:
            report = self._convert(event.state)
            if report is None:
                # the last good report of this service is no longer its truth either
                self.catalog.remove_provider_service(
                    self.name, event.service.namespace, event.service.name
                )
                return
            self.catalog.update_provider_service(
                self.name, event.service.namespace, event.service.name, report
            )
        elif event.kind == pb.EndpointsEvent.REMOVED:
            self._rejections.accept(self._source, key)
            self.catalog.remove_provider_service(
                self.name, event.service.namespace, event.service.name
            )

    @staticmethod
    def _key(ref: pb.ServiceRef) -> str:
        return f"{ref.namespace}/{ref.name}"

    def _convert(self, message: pb.ServiceEndpoints) -> ProvidedService | None:
        key = self._key(message.info.service)
        bad: list[str] = []
        try:
            report = from_proto(self.name, message, bad.append)
        except InvalidReport as exc:
            self._rejections.reject(self._source, key, str(exc))
            return None
        if bad:
            self._rejections.reject(self._source, key, "; ".join(bad))
        else:
            self._rejections.accept(self._source, key)
        return report


class ProviderSet:
    """Discovers live providers every ``interval`` and runs a follower for each.

    A provider missing from the registry keeps its endpoints for ``grace`` seconds.
    """

    def __init__(
        self,
        catalog: Catalog,
        redis: aioredis.Redis,
        health: Health,
        interval: float = 1.0,
        grace: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.catalog = catalog
        self.redis = redis
        self.health = health
        self.interval = interval
        self.grace = grace
        self._clock = clock
        self.followers: dict[str, tuple[ServiceRecord, asyncio.Event, asyncio.Task[None]]] = {}
        self.missing_since: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        loop = self.health.loops.register("provider registry")
        try:
            while not stop.is_set():
                try:
                    await self.refresh()
                    loop.up()
                except Exception as exc:  # noqa: BLE001 (Redis down: keep what we follow)
                    log.warning("providers.discovery_failed error=%r", exc)
                    loop.down(f"registry unreadable: {exc!r}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval)
        finally:
            loop.close()
            for _, halt, task in self.followers.values():
                halt.set()
                task.cancel()

    async def refresh(self) -> None:
        live = {record.name: record for record in await discover(self.redis, KIND)}
        now = self._clock()
        for name in list(self.followers):
            record, halt, task = self.followers[name]
            if name in live and live[name].grpc_address == record.grpc_address:
                self.missing_since.pop(name, None)
                continue
            if name not in live:
                since = self.missing_since.setdefault(name, now)
                if now - since < self.grace:
                    continue  # keep following (and keep its endpoints) for the grace period
                log.warning("provider.gone provider=%s after_s=%.0f", name, now - since)
                self.catalog.drop_provider(name)
                self.missing_since.pop(name, None)
            else:
                log.info("provider.moved provider=%s address=%s", name, live[name].grpc_address)
            halt.set()
            task.cancel()
            del self.followers[name]
        for name, record in live.items():
            if name not in self.followers:
                log.info("provider.found provider=%s address=%s", name, record.grpc_address)
                halt = asyncio.Event()
                follower = ProviderFollower(self.catalog, record, self.health)
                task = asyncio.create_task(follower.run(halt))
                self.followers[name] = (record, halt, task)
