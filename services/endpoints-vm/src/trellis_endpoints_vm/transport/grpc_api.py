"""The ``trellis.endpoints.v1.EndpointsProvider`` servicer over endpoints-vm's views.

The catalog watches it (``WatchServices``): every service first, then each change pushed
as the manager makes it (:attr:`~trellis_endpoints_vm.manager.EndpointsManager.feed`), the
services as they are when the answer is written, those gone as ``removed``. A one-off
reader (a tool, a benchmark) asks ``GetService`` (NOT_FOUND once the service is gone) or
``ListServices``. ``revision`` in the answers is the manager's count of changes since this
process started, for logs and status.

Requests are checked first (:mod:`.grpc_requests`); a bad field is refused through the
service's :class:`~trellis_runtime.grpcrequests.RequestGate`: INVALID_ARGUMENT naming the
field, logged, counted and shown in ``/v1/status``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_common import messages
from trellis_common.memo import Members
from trellis_endpoints_vm.domain.views import EndpointInfo, ServiceKey, ServiceView
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.transport import grpc_requests
from trellis_runtime import servicewatch
from trellis_runtime.grpcrequests import RequestGate, rpc
from trellis_runtime.health import Rejections

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["EndpointsProvider"].full_name
PROVIDER = "vm"

_LOCATIONS = {"MESH_INTERNAL": pb.MESH_INTERNAL, "MESH_EXTERNAL": pb.MESH_EXTERNAL}
_RESOLUTIONS = {
    "STATIC": pb.STATIC,
    "DNS": pb.DNS,
    "DNS_ROUND_ROBIN": pb.DNS_ROUND_ROBIN,
    "NONE": pb.NONE,
}


def endpoint_proto(endpoint: EndpointInfo) -> pb.Endpoint:
    return pb.Endpoint(**messages.fields(endpoint, maps={"ports", "labels"}))


#: Endpoints on the wire, by service, kept while the endpoint is the same object
#: (:class:`~trellis_common.memo.Members`): a service's answer after one of its 200
#: endpoints moved serializes that one, and the field is them joined
#: (:func:`~trellis_common.messages.repeated`).
EndpointProtos = Members[ServiceKey, EndpointInfo, bytes]


def endpoint_protos() -> EndpointProtos:
    """An empty memo of endpoint entries, for :func:`to_proto`."""
    return Members(lambda e, _: messages.delimited(endpoint_proto(e)))


def to_proto(
    view: ServiceView, revision: int, endpoints: EndpointProtos | None = None
) -> pb.ServiceEndpoints:
    return pb.ServiceEndpoints.FromString(encode(view, revision, endpoints))


def encode(view: ServiceView, revision: int, endpoints: EndpointProtos | None = None) -> bytes:
    """The service as a serialized ``ServiceEndpoints``: its endpoints joined from their
    kept encodings (``endpoints``, while each endpoint is the same object)."""
    info = view.info
    head = pb.ServiceEndpoints(
        info=pb.ServiceInfo(
            service=pb.ServiceRef(namespace=info.key.namespace, name=info.key.name),
            ports=[
                pb.ServicePort(
                    name=p.name, number=p.number, protocol=p.protocol, target_port=p.target_port
                )
                for p in info.ports
            ],
            hosts=info.hosts,
            addresses=info.addresses,
            location=_LOCATIONS.get(info.location, pb.LOCATION_UNSPECIFIED),
            resolution=_RESOLUTIONS.get(info.resolution, pb.RESOLUTION_UNSPECIFIED),
            export_to=info.export_to,
            subject_alt_names=info.subject_alt_names,
            source=info.source,
        ),
        revision=revision,
    )
    memo = endpoints if endpoints is not None else endpoint_protos()
    joined = memo.convert(info.key, view.endpoints)
    return head.SerializeToString() + messages.repeated(pb.ServiceEndpoints, "endpoints", joined)


class EndpointsProviderServicer(pb_grpc.EndpointsProviderServicer):
    def __init__(self, manager: EndpointsManager, rejections: Rejections | None = None) -> None:
        self._manager = manager
        self.gate = RequestGate(rejections)
        self._endpoints = endpoint_protos()

    @rpc(grpc_requests.namespace_filter)
    async def ListServices(self, namespace: str, context: Context) -> pb.ListServicesResponse:
        revision = self._manager.revision
        views = self._manager.views(namespace)
        if not namespace:
            listed = {v.key for v in views}
            self._endpoints.retain(listed.__contains__)
        return pb.ListServicesResponse(
            services=[to_proto(v, revision, self._endpoints) for v in views],
            revision=revision,
            provider=PROVIDER,
        )

    @rpc(grpc_requests.service_key)
    async def GetService(self, key: ServiceKey, context: Context) -> pb.ServiceEndpoints:
        view = self._manager.view(key)
        if view is None:
            self._endpoints.forget(key)
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no service {key} in this provider")
        return to_proto(view, self._manager.revision, self._endpoints)

    async def WatchServices(  # type: ignore[override]  # serialized answers: sent as they are
        self, request: pb.ListServicesRequest, context: Context
    ) -> AsyncIterator[pb.ServiceChanges | bytes]:
        namespace = await self.gate.check(
            context, "WatchServices", grpc_requests.namespace_filter, request
        )
        manager = self._manager

        def service_of(key: ServiceKey) -> bytes | None:
            view = manager.view(key)
            if view is None:
                self._endpoints.forget(key)
                return None
            return encode(view, manager.revision, self._endpoints)

        with manager.feed.watch() as watch:  # before the listing: nothing falls between
            listed = await self.ListServices(request, context)
            async for answer in servicewatch.service_changes(
                watch,
                listed,
                provider=PROVIDER,
                namespace=namespace,
                name_of=lambda key: (key.namespace, key.name),
                service_of=service_of,
                revision=lambda: manager.revision,
            ):
                yield answer
