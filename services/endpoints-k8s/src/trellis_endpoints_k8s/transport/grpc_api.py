"""The ``trellis.endpoints.v1.EndpointsProvider`` servicer over endpoints-k8s's services.

The same API as endpoints-vm's, so the catalog takes either provider in with no
configuration: it watches the services (``WatchServices``: every service, then each one
the watcher recomputed, or ``removed`` once it is gone or its namespace left the mesh).
``ListServices`` and ``GetService`` (NOT_FOUND once the service is gone) answer a one-off
reader. Every replica keeps its views and serves the watch; none leads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_endpoints_k8s.domain.services import PROVIDER, ServiceView
from trellis_endpoints_k8s.watcher import Key, Watcher
from trellis_runtime import grpcrequests as check
from trellis_runtime import servicewatch
from trellis_runtime.grpcrequests import RequestGate, rpc
from trellis_runtime.health import Rejections

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EndpointsProvider"].full_name


def to_proto(found: ServiceView, revision: int) -> pb.ServiceEndpoints:
    return pb.ServiceEndpoints(
        info=pb.ServiceInfo(
            service=pb.ServiceRef(namespace=found.namespace, name=found.name),
            ports=[
                pb.ServicePort(
                    name=p.name, number=p.number, protocol=p.protocol, target_port=p.target_port
                )
                for p in found.ports
            ],
            addresses=found.addresses,
            location=pb.MESH_INTERNAL,
            resolution=pb.STATIC,
            source="kubernetes",
        ),
        endpoints=[
            pb.Endpoint(
                address=e.address,
                ports=dict(e.ports),
                labels=dict(e.labels),
                locality=e.locality,
                service_account=e.service_account,
                workload=e.workload,
                source="kubernetes",
            )
            for e in found.endpoints
        ],
        revision=revision,
    )


def namespace_filter(request: pb.ListServicesRequest) -> str:
    return check.dns_label("namespace", request.namespace, optional=True)


def service_key(request: pb.GetServiceRequest) -> Key:
    if not request.HasField("service"):
        raise check.InvalidField("service", "is required")
    namespace = check.dns_label("service.namespace", request.service.namespace)
    return namespace, check.dns_label("service.name", request.service.name)


class EndpointsProviderServicer(pb_grpc.EndpointsProviderServicer):
    def __init__(self, watcher: Watcher, rejections: Rejections | None = None) -> None:
        self._watcher = watcher
        self.gate = RequestGate(rejections)

    @rpc(namespace_filter)
    async def ListServices(self, namespace: str, context: Context) -> pb.ListServicesResponse:
        revision = self._watcher.revision
        return pb.ListServicesResponse(
            services=[to_proto(v, revision) for v in self._watcher.list(namespace)],
            revision=revision,
            provider=PROVIDER,
        )

    @rpc(service_key)
    async def GetService(self, key: Key, context: Context) -> pb.ServiceEndpoints:
        found = self._watcher.views.get(key)
        if found is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no service {key[0]}/{key[1]} in a monitored namespace"
            )
        assert found is not None
        return to_proto(found, self._watcher.revision)

    async def WatchServices(  # type: ignore[override]  # serialized answers: sent as they are
        self, request: pb.ListServicesRequest, context: Context
    ) -> AsyncIterator[pb.ServiceChanges | bytes]:
        namespace = await self.gate.check(context, "WatchServices", namespace_filter, request)
        watcher = self._watcher

        def service_of(key: Key) -> pb.ServiceEndpoints | None:
            found = watcher.views.get(key)
            return None if found is None else to_proto(found, watcher.revision)

        with watcher.feed.watch() as watch:  # before the listing: nothing falls between
            listed = await self.ListServices(request, context)
            async for answer in servicewatch.service_changes(
                watch,
                listed,
                provider=PROVIDER,
                namespace=namespace,
                name_of=lambda key: key,
                service_of=service_of,
                revision=lambda: watcher.revision,
            ):
                yield answer
