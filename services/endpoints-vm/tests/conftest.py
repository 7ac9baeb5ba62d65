"""Fixtures shared by endpoints-vm's tests: workloads, declarations from YAML, the store, metrics.

The tests directory is not a package (its parent's name has a dash), so test modules cannot
import from here: what they share are fixtures, typed with the package's own types.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio
import yaml
from prometheus_client import CollectorRegistry

from trellis_common.documents import istio
from trellis_common.documents.base import KindRegistry, Origin
from trellis_endpoints_vm.domain.declarations import (
    DeclaredEndpoint,
    DeclaredEntry,
    from_documents,
)
from trellis_endpoints_vm.domain.registry import EndpointRegistry
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_testing import RedisServer
from trellis_testing.fixtures import component_client

Declarations = tuple[list[DeclaredEntry], list[DeclaredEndpoint]]


def _workload(
    name: str = "vm-1",
    services: tuple[str, ...] = ("api",),
    address: str = "10.0.0.1",
    namespace: str = "shop",
    **fields: Any,
) -> Workload:
    fields.setdefault("ports", (("http", 8080),))
    return Workload(namespace=namespace, name=name, services=services, address=address, **fields)


@pytest.fixture
def make_workload() -> Callable[..., Workload]:
    """``make_workload(name, services, address, namespace, **fields)``: a valid workload."""
    return _workload


@pytest.fixture
def kinds() -> KindRegistry:
    kinds = KindRegistry()
    istio.register(kinds)
    return kinds


@pytest.fixture
def declarations(kinds: KindRegistry) -> Callable[[str], Declarations]:
    """The ServiceEntries and WorkloadEntries of a multi-document YAML text, parsed."""

    def parse(text: str) -> Declarations:
        documents = [
            kinds.parse(raw, Origin("test.yaml", index))
            for index, raw in enumerate(yaml.safe_load_all(text))
            if raw is not None
        ]
        return from_documents(documents)

    return parse


@pytest.fixture
def registry() -> EndpointRegistry:
    return EndpointRegistry()


@pytest.fixture
def store() -> InMemoryWorkloadStore:
    return InMemoryWorkloadStore()


@pytest.fixture
def metrics_registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def metrics(metrics_registry: CollectorRegistry) -> EndpointMetrics:
    return EndpointMetrics(metrics_registry)


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[redis.asyncio.Redis]:
    """The stores' client logs in as endpoints-vm's own Redis user (see component_client)."""
    async with component_client(redis_server, "endpoints-vm") as client:
        yield client
