"""endpoints-vm's RPC checks, alone and through a real gRPC server: bad names are refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_endpoints_vm.transport import grpc_api, grpc_requests
from trellis_runtime.grpcrequests import InvalidField
from trellis_runtime.health import Health
from trellis_testing.servicer import refused_on_the_wire, served


def _get(namespace: str, name: str) -> pb.GetServiceRequest:
    return pb.GetServiceRequest(service=pb.ServiceRef(namespace=namespace, name=name))


@pytest.mark.parametrize("name", ["api", "payments.example.com", "*.example.com"])
def test_a_service_is_a_name_or_a_service_entry_host(name: str) -> None:
    assert grpc_requests.service_key(_get("shop", name)) == ServiceKey("shop", name)


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.GetServiceRequest(), "service: is required"),
        (_get("", "api"), "service.namespace: is required"),
        (_get("Bad Name!", "api"), "service.namespace: 'Bad Name!' is not a valid DNS-1123 label"),
        (_get("shop", ""), "service.name: is required"),
        (_get("shop", "*."), "service.name: '*.' is not a service name or host"),
        (_get("shop", "*.*.example.com"), "service.name: '*.*.example.com' is not a service"),
        (_get("shop", "Bad Name!"), "service.name: 'Bad Name!' is not a service name or host"),
    ],
)
def test_bad_service_names_name_the_field(request_: pb.GetServiceRequest, message: str) -> None:
    with pytest.raises(InvalidField) as caught:
        grpc_requests.service_key(request_)
    assert str(caught.value).startswith(message)


def test_the_namespace_filter_may_be_empty() -> None:
    assert grpc_requests.namespace_filter(pb.ListServicesRequest()) == ""
    assert grpc_requests.namespace_filter(pb.ListServicesRequest(namespace="shop")) == "shop"
    with pytest.raises(InvalidField, match=r"^namespace: 'Shop' is not a valid DNS-1123 label"):
        grpc_requests.namespace_filter(pb.ListServicesRequest(namespace="Shop"))


@dataclass
class Provider:
    stub: pb_grpc.EndpointsProviderAsyncStub
    health: Health
    metrics: CollectorRegistry


@pytest.fixture
async def provider(make_workload: Callable[..., Workload]) -> AsyncIterator[Provider]:
    metrics = CollectorRegistry()
    health = Health(metrics)
    manager = EndpointsManager(InMemoryWorkloadStore(), EndpointMetrics(CollectorRegistry()))
    await manager.start()
    await manager.register(make_workload())
    servicer = grpc_api.EndpointsProviderServicer(manager, health.rejections)
    register = partial(pb_grpc.add_EndpointsProviderServicer_to_server, servicer)
    async with served(register, grpc_api.SERVICE_NAME) as channel:
        yield Provider(pb_grpc.EndpointsProviderStub(channel), health, metrics)


@pytest.mark.parametrize(
    ("rpc", "request_", "message"),
    [
        (
            "ListServices",
            pb.ListServicesRequest(namespace="Bad Name!"),
            "namespace: 'Bad Name!' is not a valid DNS-1123 label",
        ),
        ("GetService", _get("shop", "Bad Name!"), "service.name: 'Bad Name!' is not a service"),
        ("GetService", pb.GetServiceRequest(), "service: is required"),
    ],
)
async def test_every_rpc_refuses_invalid_requests_naming_the_field_and_counts_them(
    provider: Provider, rpc: str, request_: object, message: str
) -> None:
    call = getattr(provider.stub, rpc)(request_)
    await refused_on_the_wire(call, rpc, message, provider.health.rejections)
    assert (
        provider.metrics.get_sample_value("trellis_rejected_records_total", {"source": "grpc"}) == 1
    )


async def test_well_formed_requests_are_answered(provider: Provider) -> None:
    listed = await provider.stub.ListServices(pb.ListServicesRequest(namespace="shop"))
    assert [s.info.service.name for s in listed.services] == ["api"]
    found = await provider.stub.GetService(_get("shop", "api"))
    assert [e.address for e in found.endpoints] == ["10.0.0.1"]
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await provider.stub.GetService(_get("shop", "payments.example.com"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert provider.health.rejections.items() == []
