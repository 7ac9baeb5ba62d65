"""gRPC scaffolding shared by every service: one ``grpc.aio`` server per process.

A :class:`GrpcServer` carries the standard health service (one status per gRPC service name
plus the overall ``""``), so Kubernetes probes work against any Trellis service, and, only
when asked (the ``debug_endpoints`` setting), server reflection for ``grpcurl``: it lists
every service and message type to whoever can connect. It runs as ``async def run(stop)``:
it serves until ``stop`` is set, then marks itself NOT_SERVING and drains in-flight calls
for ``grace`` seconds.
:mod:`trellis_identity.tls` builds the credentials for mTLS.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha.reflection import SERVICE_NAME as REFLECTION_SERVICE
from grpc_reflection.v1alpha.reflection import enable_server_reflection as enable_reflection

from trellis_common.defaults import GRPC_OPTIONS

log = logging.getLogger(__name__)

Registration = Callable[[grpc.aio.Server], None]

#: Every server's options (:data:`trellis_common.defaults.GRPC_OPTIONS`).
DEFAULT_OPTIONS = GRPC_OPTIONS


class GrpcServer:
    """A grpc.aio server with health (and reflection if asked), started and stopped by ``run``."""

    def __init__(
        self,
        address: str,
        registrations: Sequence[Registration],
        service_names: Sequence[str],
        *,
        credentials: grpc.ServerCredentials | None = None,
        grace: float = 5.0,
        options: Sequence[tuple[str, int]] = DEFAULT_OPTIONS,
        reflection: bool = False,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        self._address = address
        self._service_names = tuple(service_names)
        self._credentials = credentials
        self._grace = grace
        self._reflection = reflection
        self.server = grpc.aio.server(options=list(options), interceptors=list(interceptors))
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for register in registrations:
            register(self.server)
        if reflection:
            enable_reflection(
                (
                    *self._service_names,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    REFLECTION_SERVICE,
                ),
                self.server,
            )
        self.port = 0
        self.started = asyncio.Event()

    async def start(self) -> int:
        """Bind and start; returns the bound port (useful when the address ends in ``:0``)."""
        if self._credentials is None:
            self.port = self.server.add_insecure_port(self._address)
        else:
            self.port = self.server.add_secure_port(self._address, self._credentials)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {self._address}")
        await self.server.start()
        for name in ("", *self._service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        host = self._address.rsplit(":", 1)[0]
        log.info(
            "grpc.listening address=%s:%d tls=%s reflection=%s",
            host,
            self.port,
            self._credentials is not None,
            self._reflection,
        )
        self.started.set()
        return self.port

    async def run(self, stop: asyncio.Event) -> None:
        if not self.started.is_set():
            await self.start()
        await stop.wait()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(self._grace)
        log.info("grpc.stopped port=%d", self.port)
