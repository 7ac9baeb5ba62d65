"""endpoints-vm's process: what it is made of; the skeleton (trellis_common.service) runs it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from trellis_api import endpoints_pb2_grpc
from trellis_common.documents import istio
from trellis_common.documents.base import KindRegistry
from trellis_common.onboarding import TokenStore
from trellis_common.runtime import ServiceRuntime
from trellis_common.service import Parts, Service
from trellis_common.specdir import SpecChange, SpecDirectory
from trellis_endpoints_vm.domain.declarations import from_documents
from trellis_endpoints_vm.manager import TOPIC, EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.settings import EndpointsVmSettings
from trellis_endpoints_vm.store import RedisWorkloadStore
from trellis_endpoints_vm.transport import grpc_api, rest
from trellis_endpoints_vm.transport.credentials import Credentials

log = logging.getLogger(__name__)

KINDS = ("ServiceEntry", "WorkloadEntry")


class Declarations:
    """The spec directory's ServiceEntries and WorkloadEntries, fed to the manager."""

    def __init__(self, settings: EndpointsVmSettings, manager: EndpointsManager) -> None:
        kinds = KindRegistry()
        istio.register(kinds)
        self._manager = manager
        self._rescan = settings.spec_rescan_interval
        self._poll = settings.spec_poll_interval
        self.directory = (
            SpecDirectory(settings.spec_dir, kinds, KINDS) if settings.spec_dir else None
        )
        self.conflicts: list[str] = []

    async def load(self) -> None:
        if self.directory is not None:
            await asyncio.to_thread(self.directory.scan)
            await self._apply()

    async def _apply(self, change: SpecChange | None = None) -> None:
        assert self.directory is not None
        entries, workload_entries = from_documents(self.directory.current().values())
        self.conflicts = await self._manager.declare(entries, workload_entries)

    async def run(self, stop: asyncio.Event) -> None:
        if self.directory is not None:
            await self.directory.watch(stop, self._apply, rescan=self._rescan, poll=self._poll)

    def status(self) -> dict[str, Any]:
        if self.directory is None:
            return {"spec_dir": None, "documents": [], "conflicts": []}
        return {
            "spec_dir": str(self.directory.path),
            "watch": self.directory.watching(),
            "documents": self.directory.status(),
            "conflicts": self.conflicts,
        }


async def build(runtime: ServiceRuntime, settings: EndpointsVmSettings) -> Parts:
    outbox = runtime.outbox  # signals as settings.instance_name: our registry record's name

    async def signal(kind: str, key: str) -> int:
        return await outbox.signal(TOPIC, kind, key)

    metrics = EndpointMetrics(runtime.metrics)
    manager = EndpointsManager(
        RedisWorkloadStore(runtime.redis),
        signal,
        metrics,
        rejections=runtime.health.rejections,
        store_timeout=settings.store_timeout,
        store_check_interval=settings.store_check_interval,
    )
    await manager.start()
    declarations = Declarations(settings, manager)
    await declarations.load()
    if declarations.directory is not None:
        metrics.document_errors.set_function(lambda: len(declarations.directory.errors()))  # type: ignore[union-attr]
    servicer = grpc_api.EndpointsProviderServicer(manager, runtime.health.rejections)
    return Parts(
        components={
            "expiry sweep": lambda s: manager.run_expiry(s, settings.expiry_interval),
            "spec directory": declarations.run,
            "store keeper": lambda s: manager.keeper.run(s, runtime.health.loops),
        },
        grpc=[lambda s: endpoints_pb2_grpc.add_EndpointsProviderServicer_to_server(servicer, s)],
        grpc_services=[grpc_api.SERVICE_NAME],
        readiness={"registry": manager.ready.is_set},
        routes=lambda app: rest.add_routes(
            app,
            manager,
            Credentials(runtime.token, TokenStore(runtime.redis), metrics),
            declarations.status,
        ),
        attributes={"provider": grpc_api.PROVIDER},
    )


service = Service(EndpointsVmSettings, "endpoints-provider", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
