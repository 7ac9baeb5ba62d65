"""endpoints-vm's REST and gRPC APIs over a real manager (in-memory store)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_common import admin
from trellis_common.grpcserver import GrpcServer
from trellis_endpoints_vm.manager import EndpointsManager
from trellis_endpoints_vm.metrics import EndpointMetrics
from trellis_endpoints_vm.testing import InMemoryWorkloadStore
from trellis_endpoints_vm.transport import grpc_api, rest

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


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


class Revisions:
    def __init__(self) -> None:
        self.n = 0

    async def __call__(self, kind: str, key: str) -> int:
        self.n += 1
        return self.n


@pytest.fixture
def api_store() -> InMemoryWorkloadStore:
    return InMemoryWorkloadStore()


@pytest.fixture
async def api_manager(api_store: InMemoryWorkloadStore) -> EndpointsManager:
    manager = EndpointsManager(api_store, Revisions(), EndpointMetrics.create(CollectorRegistry()))
    await manager.start()
    return manager


@pytest.fixture
async def client(api_manager: EndpointsManager) -> AsyncIterator[httpx.AsyncClient]:
    app = admin.create_app("endpoints-vm", CollectorRegistry())
    rest.add_routes(app, api_manager, admin.token_guard(TOKEN), lambda: {"documents": []})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        yield client


@pytest.fixture
async def stub(
    api_manager: EndpointsManager,
) -> AsyncIterator[pb_grpc.EndpointsProviderAsyncStub]:
    servicer = grpc_api.EndpointsProviderServicer(api_manager)
    server = GrpcServer(
        "127.0.0.1:0",
        [lambda s: pb_grpc.add_EndpointsProviderServicer_to_server(servicer, s)],
        [grpc_api.SERVICE_NAME],
        grace=0.1,
    )
    stop = asyncio.Event()
    await server.start()
    task = asyncio.create_task(server.run(stop))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.EndpointsProviderStub(channel)
    stop.set()
    await task


async def test_register_list_heartbeat_deregister(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/workloads", json=body(), headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["alive"] is True
    listed = (await client.get("/v1/workloads")).json()
    assert [w["name"] for w in listed["workloads"]] == ["vm-1"]
    assert listed["workloads"][0]["expires_at"] > listed["workloads"][0]["last_heartbeat"]
    service = (await client.get("/v1/services/bookstore/bookstore")).json()
    assert [e["address"] for e in service["endpoints"]] == ["10.0.0.1"]
    assert service["endpoints"][0]["ports"] == {"http": 8080}
    assert service["endpoints"][0]["locality"] == "eu/west"
    beat = await client.post("/v1/workloads/bookstore/vm-1/heartbeat", headers=AUTH)
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
    assert (await client.get("/v1/workloads")).status_code == 200  # reading is open


async def test_while_redis_is_down_registrations_are_503_and_heartbeats_count(
    client: httpx.AsyncClient, api_store: InMemoryWorkloadStore
) -> None:
    assert (await client.post("/v1/workloads", json=body(), headers=AUTH)).status_code == 201
    api_store.down = True
    refused = await client.post("/v1/workloads", json=body(name="vm-2"), headers=AUTH)
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["store"] == "redis"
    assert refused.json()["detail"].startswith("Redis is unavailable (ConnectionError")
    beat = await client.post("/v1/workloads/bookstore/vm-1/heartbeat", headers=AUTH)
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


async def test_grpc_list_get_and_ordered_watch(
    client: httpx.AsyncClient, stub: pb_grpc.EndpointsProviderAsyncStub
) -> None:
    watch = stub.Watch(pb.WatchRequest())
    events = aiter(watch)
    snapshot = await anext(events)
    assert snapshot.kind == pb.EndpointsEvent.SNAPSHOT
    assert snapshot.revision == 0
    await client.post("/v1/workloads", json=body(), headers=AUTH)
    await client.post("/v1/workloads", json=body(name="vm-2", address="10.0.0.2"), headers=AUTH)
    await client.post(
        "/v1/workloads",
        json=body(name="vm-3", address="10.0.0.3", services=["other"]),
        headers=AUTH,
    )
    await client.delete("/v1/workloads/bookstore/vm-3", headers=AUTH)
    seen = [await asyncio.wait_for(anext(events), 2) for _ in range(4)]
    assert [(e.revision, e.kind, e.service.name) for e in seen] == [
        (1, pb.EndpointsEvent.CHANGED, "bookstore"),
        (2, pb.EndpointsEvent.CHANGED, "bookstore"),
        (3, pb.EndpointsEvent.CHANGED, "other"),
        (4, pb.EndpointsEvent.REMOVED, "other"),
    ]
    assert [e.address for e in seen[1].state.endpoints] == ["10.0.0.1", "10.0.0.2"]
    assert seen[0].state.endpoints[0].service_account == "bookstore"
    watch.cancel()

    listed = await stub.ListServices(pb.ListServicesRequest())
    assert [s.info.service.name for s in listed.services] == ["bookstore"]
    assert listed.revision == 4
    assert listed.provider == "vm"
    one = await stub.GetService(
        pb.GetServiceRequest(service=pb.ServiceRef(namespace="bookstore", name="bookstore"))
    )
    assert one.info.ports[0].name == "http"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetService(
            pb.GetServiceRequest(service=pb.ServiceRef(namespace="bookstore", name="nope"))
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
