"""Fuzzing endpoints-vm's gRPC requests: the checks alone, then the servicer behind them.

Promises: a check returns or raises ``InvalidField`` naming a field of the request; the
servicer answers, or ends the call with INVALID_ARGUMENT naming a field (recorded as a
rejection) or NOT_FOUND for a well-formed name it does not know; nothing else escapes.
"""

from __future__ import annotations

from google.protobuf.message import Message
from hypothesis import event, example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_api import endpoints_pb2 as pb
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_endpoints_vm.transport import grpc_requests
from trellis_endpoints_vm.transport.grpc_api import EndpointsProviderServicer
from trellis_runtime.health import Health
from trellis_testing import strategies as fuzz
from trellis_testing.servicer import Checks, answers_or_refuses, check_names_a_field

CHECKS: Checks = {
    "ListServices": (pb.ListServicesRequest, grpc_requests.namespace_filter, {"namespace"}),
    "GetService": (
        pb.GetServiceRequest,
        grpc_requests.service_key,
        {"service", "service.namespace", "service.name"},
    ),
}
STRINGS = fuzz.mostly(
    st.one_of(fuzz.plausible_names(), st.sampled_from(["shop", "api"])), fuzz.names()
)


LOOKUPS = st.builds(
    pb.GetServiceRequest,
    service=st.builds(
        pb.ServiceRef,
        namespace=fuzz.mostly(st.sampled_from(["shop", "other"]), fuzz.names()),
        name=fuzz.mostly(st.sampled_from(["api", "*.example.com", "a.example.com"]), fuzz.names()),
    ),
)


def requests() -> st.SearchStrategy[tuple[str, Message]]:
    anything = st.sampled_from(sorted(CHECKS)).flatmap(
        lambda rpc: st.tuples(st.just(rpc), fuzz.messages(CHECKS[rpc][0], strings=STRINGS))
    )
    return st.one_of(anything, st.tuples(st.just("GetService"), LOOKUPS))


@given(asked=requests())
@example(asked=("GetService", pb.GetServiceRequest(service=pb.ServiceRef(name="*."))))
def test_checks_return_or_name_a_field_of_the_request(asked: tuple[str, Message]) -> None:
    check_names_a_field(CHECKS, *asked)


@given(asked=requests())
@example(
    asked=("GetService", pb.GetServiceRequest(service=pb.ServiceRef(namespace="shop", name="api")))
)
async def test_the_servicer_answers_or_refuses_naming_a_field(asked: tuple[str, Message]) -> None:
    rpc, request = asked
    manager = EndpointsManager(InMemoryWorkloadStore(), EndpointMetrics(CollectorRegistry()))
    await manager.start()
    await manager.register(
        Workload(
            namespace="shop",
            name="vm-1",
            services=("api",),
            address="10.0.0.1",
            ports=(("http", 8080),),
        )
    )
    health = Health()
    servicer = EndpointsProviderServicer(manager, health.rejections)

    aborted = await answers_or_refuses(servicer, rpc, request, health.rejections, CHECKS)

    event(f"{rpc} {aborted.code.name if aborted else 'OK'}")
    assert len(health.rejections.items()) <= 1  # one call, one rejection at most
