"""Fuzzing what endpoints-vm does with every ServiceEntry/WorkloadEntry the parser accepts.

The parser's own fuzz suite (libs/common) checks what it refuses; here, whatever it accepts
(specs built field by field, several documents at once, with registered workloads beside
them) must declare, resolve and convert to the provider's protobuf without an exception,
and every view it yields must belong to a host some accepted ServiceEntry declares.
"""

from __future__ import annotations

from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from trellis_common.documents import istio
from trellis_common.documents.base import Document, DocumentError, KindRegistry, Origin
from trellis_endpoints_vm.domain.declarations import from_documents
from trellis_endpoints_vm.domain.registry import EndpointRegistry
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.transport.grpc_api import to_proto
from trellis_testing import strategies as fuzz

KINDS = KindRegistry()
istio.register(KINDS)
WORKLOAD = Workload(
    namespace="shop",
    name="vm-1",
    services=("api",),
    address="10.0.0.1",
    ports=(("http", 8080),),
    labels=(("app", "cart"),),
)


def documents() -> st.SearchStrategy[list[dict[str, Any]]]:
    def document(kind: str, spec: dict[str, Any], name: str) -> dict[str, Any]:
        metadata = {"name": name, "namespace": "shop", "labels": {"app": "cart"}}
        return {
            "apiVersion": istio.API_VERSIONS[-1],
            "kind": kind,
            "metadata": metadata,
            "spec": spec,
        }

    names = st.sampled_from(["a", "b", "c"])
    entries = st.builds(document, st.just("ServiceEntry"), fuzz.service_entry_specs(), names)
    workloads = st.builds(document, st.just("WorkloadEntry"), fuzz.workload_entry_specs(), names)
    return st.lists(st.one_of(entries, workloads), min_size=1, max_size=4)


@given(raws=documents())
def test_accepted_entries_resolve_and_convert(raws: list[dict[str, Any]]) -> None:
    accepted: list[Document] = []
    for index, raw in enumerate(raws):
        try:
            accepted.append(KINDS.parse(raw, Origin("fuzz.yaml", index)))
        except DocumentError:
            continue
    latest = {doc.key: doc for doc in accepted}  # as the spec directory resolves duplicates
    event(f"{len(latest)} documents accepted")
    entries, workload_entries = from_documents(latest.values())
    registry = EndpointRegistry()
    registry.upsert(WORKLOAD, 0.0)
    registry.declare(entries, workload_entries, 1.0)

    hosts = {(e.namespace, host) for e in entries for host in e.hosts}
    for key, view in registry.views.items():
        assert key.name == "api" or (key.namespace, key.name) in hosts
        assert to_proto(view, 1).info.service.name == key.name
