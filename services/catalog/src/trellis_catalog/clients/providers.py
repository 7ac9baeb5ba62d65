"""Following the endpoints providers: whichever are alive, each over its watch stream.

Providers announce themselves in the service registry (kind ``endpoints-provider``). For
each live one, a follower opens ``Watch``, lists everything once it has the SNAPSHOT
(so nothing between the two is missed), then applies each change in order. A stream that
breaks is reopened with backoff and resyncs in full; a provider whose registry entry
expires is dropped from the catalog, and one that appears is followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
import redis.asyncio as aioredis

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.services import ProvidedEndpoint, ProvidedService
from trellis_common.follow import follow_forever
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


def from_proto(provider: str, message: pb.ServiceEndpoints) -> ProvidedService:
    info = message.info
    return ProvidedService(
        provider=provider,
        namespace=info.service.namespace,
        name=info.service.name,
        ports=tuple((p.name, p.number, p.protocol, p.target_port) for p in info.ports),
        endpoints=tuple(
            ProvidedEndpoint(
                address=e.address,
                ports=tuple(sorted(e.ports.items())),
                labels=tuple(sorted(e.labels.items())),
                locality=e.locality,
                weight=e.weight,
                service_account=e.service_account,
                workload=e.workload,
            )
            for e in message.endpoints
        ),
        hosts=tuple(info.hosts),
        addresses=tuple(info.addresses),
        location=_LOCATION.get(info.location, "MESH_INTERNAL"),
        resolution=_RESOLUTION.get(info.resolution, "STATIC"),
        export_to=tuple(info.export_to),
        subject_alt_names=tuple(info.subject_alt_names),
        source=info.source,
    )


class ProviderFollower:
    """Keeps one provider's services in the catalog while the provider is alive."""

    def __init__(self, catalog: Catalog, record: ServiceRecord) -> None:
        self.catalog = catalog
        self.record = record
        self.name = record.name
        self.synced = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        async def session() -> None:
            async with grpc.aio.insecure_channel(self.record.grpc_address) as channel:
                await self._follow(pb_grpc.EndpointsProviderStub(channel), stop)

        await follow_forever(
            session,
            stop,
            what=f"provider {self.name} {self.record.grpc_address}",
            on_lost=self.synced.clear,
        )

    async def _follow(self, stub: pb_grpc.EndpointsProviderAsyncStub, stop: asyncio.Event) -> None:
        stream = stub.Watch(pb.WatchRequest())
        stopper = asyncio.create_task(stop.wait())
        try:
            events = aiter(stream)
            first = await anext(events)
            if first.kind != pb.EndpointsEvent.SNAPSHOT:
                raise RuntimeError(f"provider {self.name} did not start with a SNAPSHOT")
            listed = await stub.ListServices(pb.ListServicesRequest(), timeout=30)
            self.catalog.set_provider_services(
                self.name, [from_proto(self.name, s) for s in listed.services]
            )
            self.synced.set()
            log.info(
                "provider.synced provider=%s services=%d revision=%d",
                self.name,
                len(listed.services),
                listed.revision,
            )
            while True:
                reading = asyncio.ensure_future(anext(events))
                await asyncio.wait({reading, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if stopper.done():
                    reading.cancel()
                    return
                event = reading.result()
                if event.revision <= listed.revision:
                    continue  # already in the list
                if event.kind == pb.EndpointsEvent.CHANGED:
                    self.catalog.update_provider_service(
                        self.name,
                        event.service.namespace,
                        event.service.name,
                        from_proto(self.name, event.state),
                    )
                elif event.kind == pb.EndpointsEvent.REMOVED:
                    self.catalog.update_provider_service(
                        self.name, event.service.namespace, event.service.name, None
                    )
        finally:
            stopper.cancel()
            stream.cancel()


class ProviderSet:
    """Discovers live providers every ``interval`` and runs a follower for each."""

    def __init__(self, catalog: Catalog, redis: aioredis.Redis, interval: float = 1.0) -> None:
        self.catalog = catalog
        self.redis = redis
        self.interval = interval
        self.followers: dict[str, tuple[ServiceRecord, asyncio.Event, asyncio.Task[None]]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.refresh(stop)
                except Exception as exc:  # noqa: BLE001 (Redis down: keep what we follow)
                    log.warning("providers.discovery_failed error=%r", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval)
        finally:
            for _, halt, task in self.followers.values():
                halt.set()
                task.cancel()

    async def refresh(self, stop: asyncio.Event) -> None:
        live = {record.name: record for record in await discover(self.redis, KIND)}
        for name in list(self.followers):
            record, halt, task = self.followers[name]
            if name not in live or live[name].grpc_address != record.grpc_address:
                log.info("provider.gone provider=%s", name)
                halt.set()
                task.cancel()
                del self.followers[name]
                if name not in live:
                    self.catalog.drop_provider(name)
        for name, record in live.items():
            if name not in self.followers:
                log.info("provider.found provider=%s address=%s", name, record.grpc_address)
                halt = asyncio.Event()
                follower = ProviderFollower(self.catalog, record)
                task = asyncio.create_task(follower.run(halt))
                self.followers[name] = (record, halt, task)
