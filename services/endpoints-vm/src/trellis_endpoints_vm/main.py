"""endpoints-vm's process: what it is made of; the skeleton (trellis_runtime.service) runs it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from trellis_api import endpoints_pb2_grpc
from trellis_common.documents import istio
from trellis_common.documents.base import KindRegistry
from trellis_common.specdir import SpecChange, SpecDirectory
from trellis_endpoints_vm.domain.declarations import from_documents
from trellis_endpoints_vm.manager import MIRROR, EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.mirroring import Peers
from trellis_endpoints_vm.replicas import WorkloadFollower
from trellis_endpoints_vm.settings import EndpointsVmSettings
from trellis_endpoints_vm.store import RedisWorkloadStore
from trellis_endpoints_vm.transport import grpc_api, rest
from trellis_endpoints_vm.transport.credentials import Credentials
from trellis_identity.onboarding import TokenStore
from trellis_kube import client as kube
from trellis_kube.leadership import elect_for
from trellis_runtime.lifecycle import freeze_startup_heap, run_components
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

log = logging.getLogger(__name__)

KINDS = ("ServiceEntry", "WorkloadEntry")


class Declarations:
    """The ServiceEntries and WorkloadEntries of the spec directory and of the API server
    (with a kubeconfig, or in a pod), joined and fed to the manager on every change."""

    def __init__(self, settings: EndpointsVmSettings, manager: EndpointsManager) -> None:
        kinds = KindRegistry()
        istio.register(kinds)
        self._manager = manager
        self._rescan = settings.spec_rescan_interval
        self._poll = settings.spec_poll_interval
        self.directory = (
            SpecDirectory(settings.spec_dir, kinds, KINDS) if settings.spec_dir else None
        )
        self.kube: Any = None
        if settings.kubeconfig is not None or kube.in_cluster():
            from trellis_kube.documents import KubeDocuments

            self.kube = KubeDocuments(
                kube.api_client(settings.kubeconfig),
                settings.mesh_name,
                kinds,
                kinds=KINDS,
                watch_timeout=settings.watch_timeout,
            )
        self.conflicts: list[str] = []
        self.kube_errors: list[str] = []

    async def load(self) -> None:
        if self.directory is not None:
            await asyncio.to_thread(self.directory.scan)
            await self._apply()

    async def _apply(self, change: SpecChange | None = None) -> None:
        found = list(self.directory.current().values()) if self.directory is not None else []
        if self.kube is not None and self.kube.synced:
            documents, errors = self.kube.documents()
            self.kube_errors = [str(e) for e in errors]
            found += documents
        entries, workload_entries = from_documents(found)
        self.conflicts = await self._manager.declare(entries, workload_entries)

    async def run(self, stop: asyncio.Event) -> None:
        parts: list[Callable[[asyncio.Event], Awaitable[None]]] = []
        if self.directory is not None:
            directory = self.directory
            parts.append(
                lambda s: directory.watch(s, self._apply, rescan=self._rescan, poll=self._poll)
            )
        if self.kube is not None:
            parts += [*self.kube.parts(), self._following]
        await run_components(parts, stop)

    async def _following(self, stop: asyncio.Event) -> None:
        """Declare again on every change the API server's objects make."""
        changed = self.kube.changed
        while not stop.is_set():
            waits = {asyncio.ensure_future(changed.wait()), asyncio.ensure_future(stop.wait())}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for wait in waits:
                wait.cancel()
            if stop.is_set() or not self.kube.synced:
                continue
            changed.clear()
            await self._apply()

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = {"spec_dir": None, "documents": [], "conflicts": self.conflicts}
        if self.directory is not None:
            found.update(
                spec_dir=str(self.directory.path),
                watch=self.directory.watching(),
                documents=self.directory.status(),
            )
        if self.kube is not None:
            found["kubernetes"] = {**self.kube.describe(), "errors": self.kube_errors}
        return found


async def build(runtime: ServiceRuntime, settings: EndpointsVmSettings) -> Parts:
    outbox = runtime.outbox  # signals as settings.instance_name: our registry record's name

    async def notify(kind: str, workload_id: str) -> int:  # for the other replicas
        return await outbox.signal(MIRROR, kind, workload_id)

    peers = Peers(settings.instance_name, runtime.replicas, notify)

    # the TTL is judged by one replica: the leader (a Redis lock locally, a Lease in a pod)
    leadership = elect_for(settings, redis=runtime.redis, health=runtime.health)
    metrics = EndpointMetrics(runtime.metrics)
    manager = EndpointsManager(
        RedisWorkloadStore(runtime.redis, min_replicas=settings.redis_min_replicas_ack),
        metrics,
        rejections=runtime.health.rejections,
        store_timeout=settings.store_timeout,
        store_check_interval=settings.store_check_interval,
        notify=notify,
        leading=lambda: leadership.leading,
        alone=peers.alone,
        reap_after=settings.reap_after,
    )
    metrics.replicas.set_function(lambda: len(peers.others))
    await manager.start()
    declarations = Declarations(settings, manager)
    await declarations.load()
    if declarations.directory is not None:
        metrics.document_errors.set_function(lambda: len(declarations.directory.errors()))  # type: ignore[union-attr]
    servicer = grpc_api.EndpointsProviderServicer(manager, runtime.health.rejections)
    runtime.signals.follow(WorkloadFollower(manager, settings.instance_name, peers))
    freeze_startup_heap()  # the registry and the declarations as loaded: long-lived
    return Parts(
        components={
            "leader election": leadership.run,
            "expiry sweep": lambda s: manager.run_expiry(s, settings.expiry_interval),
            "declarations": declarations.run,
            "store keeper": lambda s: manager.keeper.run(s, runtime.health.loops),
            "replica lookup": peers.run,
        },
        grpc=[lambda s: endpoints_pb2_grpc.add_EndpointsProviderServicer_to_server(servicer, s)],
        grpc_services=[grpc_api.SERVICE_NAME],
        readiness={"registry": manager.ready.is_set},
        routes=lambda app: rest.add_routes(
            app,
            manager,
            Credentials(
                runtime.admin_token, TokenStore(runtime.redis, counter="endpoints-vm"), metrics
            ),
            declarations.status,
        ),
        attributes={"provider": grpc_api.PROVIDER},
    )


service = Service(EndpointsVmSettings, "endpoints-provider", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
