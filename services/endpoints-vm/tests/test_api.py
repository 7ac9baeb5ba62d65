"""endpoints-vm's REST and gRPC APIs over a real manager (in-memory store).

The watch tests follow a registration as the catalog does: a POST, then its service on a
``WatchServices`` stream over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.reaping import REAP_AFTER_SECONDS
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_endpoints_vm.transport import grpc_api, rest
from trellis_endpoints_vm.transport.credentials import Credentials
from trellis_identity.onboarding import TokenStore
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_testing.onboarding import InMemoryTokenStore
from trellis_testing.servicer import served

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def body(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "namespace": "bookstore",
        "name": "vm-1",
        "services": ["bookstore"],
        "address": "10.0.0.1",
        "ports": [{"name": "http", "number": 8080}],
        "labels": {"app": "bookstore", "version": "v1"},
        "service_account": "bookstore",
        "locality": "eu/west",
        "ttl": 30,
    }
    base.update(overrides)
    return base


@contextlib.asynccontextmanager
async def admin_client(
    manager: EndpointsManager, tokens: TokenStore | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    registry = CollectorRegistry()
    app = admin.create_app("endpoints-vm", registry)
    credentials = Credentials(
        AdminToken.of(TOKEN), tokens or InMemoryTokenStore(), EndpointMetrics(registry)
    )
    rest.add_routes(app, manager, credentials, lambda: {"documents": []})
    app.state.metrics = registry
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


@contextlib.asynccontextmanager
async def grpc_stub(manager: EndpointsManager) -> AsyncIterator[pb_grpc.EndpointsProviderAsyncStub]:
    servicer = grpc_api.EndpointsProviderServicer(manager)
    register = partial(pb_grpc.add_EndpointsProviderServicer_to_server, servicer)
    async with served(register, grpc_api.SERVICE_NAME) as channel:
        yield pb_grpc.EndpointsProviderStub(channel)


@pytest.fixture
def api_store() -> InMemoryWorkloadStore:
    return InMemoryWorkloadStore()


@pytest.fixture
async def api_manager(api_store: InMemoryWorkloadStore) -> EndpointsManager:
    manager = EndpointsManager(api_store, EndpointMetrics(CollectorRegistry()))
    await manager.start()
    return manager


@pytest.fixture
async def client(api_manager: EndpointsManager) -> AsyncIterator[httpx.AsyncClient]:
    async with admin_client(api_manager) as client:
        yield client


@pytest.fixture
async def stub(
    api_manager: EndpointsManager,
) -> AsyncIterator[pb_grpc.EndpointsProviderAsyncStub]:
    async with grpc_stub(api_manager) as stub:
        yield stub


async def test_register_list_heartbeat_deregister(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/workloads", json=body(), headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["alive"] is True
    listed = (await client.get("/v1/workloads")).json()
    assert [w["name"] for w in listed["workloads"]] == ["vm-1"]
    listed_vm = listed["workloads"][0]
    assert listed_vm["expires_at"] > listed_vm["last_heartbeat"]
    # if no heartbeat comes, the leader deregisters it reap_after (an hour) past its TTL
    assert listed_vm["reaped_at"] == listed_vm["expires_at"] + REAP_AFTER_SECONDS
    assert created.json()["reaped_at"] == listed_vm["reaped_at"]
    service = (await client.get("/v1/services/bookstore/bookstore")).json()
    assert [e["address"] for e in service["endpoints"]] == ["10.0.0.1"]
    assert service["endpoints"][0]["ports"] == {"http": 8080}
    assert service["endpoints"][0]["locality"] == "eu/west"
    token = created.json()["heartbeat_token"]
    assert token not in str(listed)  # shown once, at registration
    beat = await client.post("/v1/workloads/bookstore/vm-1/heartbeat", headers=bearer(token))
    assert beat.status_code == 200
    gone = await client.delete("/v1/workloads/bookstore/vm-1", headers=AUTH)
    assert gone.status_code == 204
    missing = await client.get("/v1/services/bookstore/bookstore")
    assert missing.status_code == 404
    again = await client.delete("/v1/workloads/bookstore/vm-1", headers=AUTH)
    assert again.status_code == 404
    assert "vm-1" in again.json()["detail"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"address": "not-an-ip"}, "address"),
        ({"services": ["Bad_Name"]}, "services[0]"),
        ({"ports": [{"name": "http", "number": 70000}]}, "ports[http]"),
        ({"namespace": "UPPER"}, "namespace"),
        ({"ttl": 0}, "ttl"),
        ({"weight": -1}, "weight"),
    ],
)
async def test_bad_bodies_are_422_naming_the_field_and_change_nothing(
    client: httpx.AsyncClient, overrides: dict[str, Any], field: str
) -> None:
    response = await client.post("/v1/workloads", json=body(**overrides), headers=AUTH)
    assert response.status_code == 422
    assert response.json()["field"] == field
    assert (await client.get("/v1/workloads")).json()["workloads"] == []


@pytest.mark.parametrize(
    "raw",
    [
        {"namespace": "ns"},  # missing fields
        {**body(), "colour": "blue"},  # unknown field
        {**body(), "ports": []},
        {**body(), "ports": [{"number": "eighty"}]},
    ],
)
async def test_malformed_bodies_are_422(client: httpx.AsyncClient, raw: dict[str, Any]) -> None:
    response = await client.post("/v1/workloads", json=raw, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["detail"]


async def test_mutations_need_the_token(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/workloads", json=body())).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert (await client.post("/v1/workloads", json=body(), headers=wrong)).status_code == 403
    assert (await client.post("/v1/workloads/bookstore/vm-1/heartbeat")).status_code == 401
    assert (await client.delete("/v1/workloads/bookstore/vm-1")).status_code == 401
    # an invalid body without a token is refused for the token, not described
    invalid = await client.post("/v1/workloads", json=body(address="nope"))
    assert invalid.status_code == 401
    assert (await client.get("/v1/workloads")).status_code == 200  # reading is open


async def test_while_redis_is_down_registrations_are_503_and_heartbeats_count(
    client: httpx.AsyncClient, api_store: InMemoryWorkloadStore
) -> None:
    created = await client.post("/v1/workloads", json=body(), headers=AUTH)
    assert created.status_code == 201
    token = created.json()["heartbeat_token"]
    api_store.down = True
    refused = await client.post("/v1/workloads", json=body(name="vm-2"), headers=AUTH)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["store"] == "redis"
    assert refused.json()["detail"].startswith("Redis is unavailable (ConnectionError")
    beat = await client.post("/v1/workloads/bookstore/vm-1/heartbeat", headers=bearer(token))
    assert beat.status_code == 200
    assert beat.json()["persisted"] is False
    kept = await client.delete("/v1/workloads/bookstore/vm-1", headers=AUTH)
    assert kept.status_code == 503
    listed = (await client.get("/v1/workloads")).json()["workloads"]
    assert [(w["name"], w["alive"]) for w in listed] == [("vm-1", True)]


async def test_heartbeat_of_unknown_workload_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/workloads/bookstore/ghost/heartbeat", headers=AUTH)
    assert response.status_code == 404
    assert "register it first" in response.json()["detail"]


async def _answer(call: Any) -> pb.ServiceChanges:
    """A watch's next answer (at most 5 s away)."""
    answer = await asyncio.wait_for(call.read(), 5)
    assert isinstance(answer, pb.ServiceChanges), answer
    return answer


def ref(name: str) -> pb.GetServiceRequest:
    return pb.GetServiceRequest(service=pb.ServiceRef(namespace="bookstore", name=name))


async def test_grpc_list_and_get(
    client: httpx.AsyncClient, stub: pb_grpc.EndpointsProviderAsyncStub
) -> None:
    await client.post("/v1/workloads", json=body(), headers=AUTH)
    await client.post("/v1/workloads", json=body(name="vm-2", address="10.0.0.2"), headers=AUTH)
    await client.post(
        "/v1/workloads",
        json=body(name="vm-3", address="10.0.0.3", services=["other"]),
        headers=AUTH,
    )
    await client.delete("/v1/workloads/bookstore/vm-3", headers=AUTH)

    listed = await stub.ListServices(pb.ListServicesRequest())
    assert [s.info.service.name for s in listed.services] == ["bookstore"]
    assert listed.revision == 4  # four changes since the manager started
    assert listed.provider == "vm"
    one = await stub.GetService(ref("bookstore"))
    assert one.info.ports[0].name == "http"
    assert [e.address for e in one.endpoints] == ["10.0.0.1", "10.0.0.2"]
    assert one.endpoints[0].service_account == "bookstore"
    for gone in ("other", "nope"):  # removed, and never known: the same answer
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.GetService(ref(gone))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_watch_lists_every_service_then_pushes_each_change(
    client: httpx.AsyncClient, stub: pb_grpc.EndpointsProviderAsyncStub
) -> None:
    """WatchServices, as the catalog follows a provider: every service first, then each
    registration's service as it is now, and a service gone as ``removed``."""
    await client.post("/v1/workloads", json=body(), headers=AUTH)
    call = stub.WatchServices(pb.ListServicesRequest())
    try:
        first = await _answer(call)
        assert first.full
        assert first.provider == "vm"
        assert [(s.info.service.name, len(s.endpoints)) for s in first.services] == [
            ("bookstore", 1)
        ]
        await client.post("/v1/workloads", json=body(name="vm-2", address="10.0.0.2"), headers=AUTH)
        moved = await _answer(call)
        assert not moved.full
        [service] = moved.services
        assert [e.address for e in service.endpoints] == ["10.0.0.1", "10.0.0.2"]
        assert moved.revision == 2

        await client.delete("/v1/workloads/bookstore/vm-2", headers=AUTH)
        await client.delete("/v1/workloads/bookstore/vm-1", headers=AUTH)
        gone = await _answer(call)
        if gone.services:  # the two deletions may come in one answer or two
            gone = await _answer(call)
        assert list(gone.services) == []
        assert [(r.namespace, r.name) for r in gone.removed] == [("bookstore", "bookstore")]
    finally:
        call.cancel()


async def test_a_watch_for_a_bad_namespace_is_refused_naming_it(
    stub: pb_grpc.EndpointsProviderAsyncStub,
) -> None:
    call = stub.WatchServices(pb.ListServicesRequest(namespace="Not A Label"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "namespace" in (caught.value.details() or "")
