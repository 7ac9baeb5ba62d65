"""The shared gRPC server: health per service, reflection, registrations and shutdown."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from trellis_runtime.grpcserver import GrpcServer

SERVICE = "some.Service"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def echo(request: bytes, _: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return b"echo:" + request


def register_echo(server: grpc.aio.Server) -> None:
    """A raw-bytes ``some.Service/Echo`` method, standing in for a generated servicer."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE, {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server.add_generic_rpc_handlers((handler,))


@dataclass
class Running:
    server: GrpcServer
    stop: asyncio.Event
    task: asyncio.Task[None]
    channel: grpc.aio.Channel

    @property
    def health(self) -> health_pb2_grpc.HealthStub:
        return health_pb2_grpc.HealthStub(self.channel)


@pytest.fixture(params=[True], ids=["reflection"])
async def running(request: pytest.FixtureRequest) -> AsyncIterator[Running]:
    # None: the constructor's default, which is what every service gets without the setting
    asked = {} if request.param is None else {"reflection": request.param}
    server = GrpcServer("127.0.0.1:0", [register_echo], [SERVICE], grace=0.5, **asked)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    await asyncio.wait_for(server.started.wait(), 5)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield Running(server, stop, task, channel)
    stop.set()
    await asyncio.wait_for(task, 5)


async def check(stub: health_pb2_grpc.HealthStub, service: str) -> int:
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    status: int = response.status
    return status


async def list_services(channel: grpc.aio.Channel) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names: list[str] = []
    async for response in call:
        names.extend(service.name for service in response.list_services_response.service)
    return names


async def test_run_binds_a_free_port(running: Running) -> None:
    assert running.server.port > 0
    assert running.server.started.is_set()
    assert not running.task.done()


async def test_health_is_serving_overall_and_per_service(running: Running) -> None:
    assert await check(running.health, "") == SERVING
    assert await check(running.health, SERVICE) == SERVING


async def test_health_of_an_unknown_service_is_not_found(running: Running) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(running.health, "other.Service")

    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_services(running: Running) -> None:
    assert sorted(await list_services(running.channel)) == sorted([SERVICE, HEALTH, REFLECTION])


@pytest.mark.parametrize("running", [None], ids=["default"], indirect=True)
async def test_reflection_is_off_unless_asked_for(running: Running) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await list_services(running.channel)
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert await check(running.health, SERVICE) == SERVING  # health stays on


async def test_registrations_are_served(running: Running) -> None:
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = running.channel.unary_unary(
        f"/{SERVICE}/Echo"
    )

    assert await call(b"ping", timeout=5) == b"echo:ping"


async def test_stop_marks_not_serving_and_closes_the_port(running: Running) -> None:
    watch = running.health.Watch(health_pb2.HealthCheckRequest(service=SERVICE))
    first = await asyncio.wait_for(watch.read(), 5)
    assert first.status == SERVING

    running.stop.set()
    second = await asyncio.wait_for(watch.read(), 5)
    assert second.status == NOT_SERVING
    watch.cancel()  # the server drains in-flight calls: let this one end
    await asyncio.wait_for(running.task, 5)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.server.port}") as fresh:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(health_pb2_grpc.HealthStub(fresh), "")
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_start_before_run_is_not_repeated() -> None:
    server = GrpcServer("127.0.0.1:0", [], [SERVICE], grace=0.1)
    port = await server.start()
    stop = asyncio.Event()
    stop.set()

    await asyncio.wait_for(server.run(stop), 5)

    assert port == server.port > 0
