"""GetService's answer: endpoint entries kept while the endpoint is the same object."""

from __future__ import annotations

from collections.abc import Callable

from trellis_endpoints_vm.domain.registry import EndpointRegistry
from trellis_endpoints_vm.domain.views import ServiceKey
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.transport.grpc_api import endpoint_protos, to_proto

API = ServiceKey("shop", "api")


def test_an_answer_after_one_endpoint_moved_converts_that_one(
    registry: EndpointRegistry, make_workload: Callable[..., Workload]
) -> None:
    memo = endpoint_protos()
    for i in range(20):
        registry.upsert(make_workload(f"vm-{i}", address=f"10.0.0.{i}"), 1.0)
    first = to_proto(registry.views[API], 1, memo)
    assert first == to_proto(registry.views[API], 1)
    registry.upsert(make_workload("vm-7", address="10.0.1.7", labels=(("v", "2"),)), 2.0)
    second = to_proto(registry.views[API], 2, memo)
    assert second == to_proto(registry.views[API], 2)
    assert (memo.misses, memo.hits) == (21, 19)
    assert [e.workload for e in second.endpoints if dict(e.labels) == {"v": "2"}] == ["shop/vm-7"]
