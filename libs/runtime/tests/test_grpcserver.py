"""The shared gRPC server: health per service, reflection, registrations and shutdown."""

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from trellis_runtime.grpcserver import STOPPING, GrpcServer
from trellis_testing.waiting import eventually

SERVICE = "some.Service"
HEALTH = "grpc.health.v1.Health"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def echo(request: bytes, _: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return b"echo:" + request


class Text:
    """A stand-in response message whose serializer is :func:`serialize`."""

    def __init__(self, data: bytes) -> None:
        self.data = data


def serialize(answer: Text) -> bytes:
    return b"serialized:" + answer.data


class Watches:
    """Streams that never end on their own (watches), in the two ways a servicer writes them,
    and a unary call that waits for ``release``; what each handler's clean-up saw."""

    def __init__(self) -> None:
        self.cleaned: list[str] = []
        self.release = asyncio.Event()
        self.slow_calls = 0

    async def generated(self, request: bytes, _: grpc.aio.ServicerContext[bytes, bytes]) -> Any:
        try:
            yield b"first:" + request
            yield Text(b"second")  # a message: its serializer runs
            await asyncio.Event().wait()
        finally:
            self.cleaned.append("generated")

    async def written(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> None:
        try:
            async for request in requests:
                await context.write(b"seen:" + request)
        finally:
            self.cleaned.append("written")

    async def slow(self, request: bytes, _: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        self.slow_calls += 1
        await self.release.wait()
        return b"slow:" + request


WATCHES = Watches()


def register_echo(server: grpc.aio.Server) -> None:
    """Raw-bytes ``some.Service`` methods, standing in for a generated servicer."""
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Slow": grpc.unary_unary_rpc_method_handler(WATCHES.slow),
            "Generated": grpc.unary_stream_rpc_method_handler(
                WATCHES.generated, response_serializer=serialize
            ),
            "Written": grpc.stream_stream_rpc_method_handler(WATCHES.written),
        },
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


@dataclass
class Stubs:
    generated: grpc.aio.UnaryStreamMultiCallable[bytes, bytes]
    written: grpc.aio.StreamStreamMultiCallable[bytes, bytes]
    slow: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]


def streams(channel: grpc.aio.Channel) -> Stubs:
    return Stubs(
        channel.unary_stream(f"/{SERVICE}/Generated"),
        channel.stream_stream(f"/{SERVICE}/Written"),
        channel.unary_unary(f"/{SERVICE}/Slow"),
    )


async def test_stop_ends_open_streams_at_once_and_drains_unary_calls() -> None:
    WATCHES.cleaned.clear()
    WATCHES.release.clear()
    WATCHES.slow_calls = 0
    server = GrpcServer("127.0.0.1:0", [register_echo], [SERVICE], grace=60)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    await asyncio.wait_for(server.started.wait(), 5)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        generated = streams(channel).generated(b"a")
        written = streams(channel).written()
        await written.write(b"b")
        # bytes go out as they are; a message through the method's serializer
        assert await asyncio.wait_for(generated.read(), 5) == b"first:a"
        assert await asyncio.wait_for(generated.read(), 5) == b"serialized:second"
        assert await asyncio.wait_for(written.read(), 5) == b"seen:b"
        slow = asyncio.ensure_future(streams(channel).slow(b"c", timeout=30))
        await eventually(lambda: server.streams.open == 2 and WATCHES.slow_calls == 1)

        stop.set()
        # both watches end with UNAVAILABLE long before the 60 s grace, their clean-up run
        for call in (generated, written):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(call.read(), 10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert caught.value.details() == STOPPING
        assert sorted(WATCHES.cleaned) == ["generated", "written"]
        assert not task.done()  # the unary call in flight is drained, not cut
        WATCHES.release.set()
        assert await asyncio.wait_for(slow, 10) == b"slow:c"
        await asyncio.wait_for(task, 10)
    assert server.streams.end() == 0  # nothing left open
    assert server.streams.stopping


async def test_a_stream_that_ends_on_its_own_is_not_held() -> None:
    server = GrpcServer("127.0.0.1:0", [register_echo], [SERVICE], grace=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    await asyncio.wait_for(server.started.wait(), 5)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        written = streams(channel).written()
        await written.write(b"x")
        assert await asyncio.wait_for(written.read(), 5) == b"seen:x"
        await written.done_writing()
        assert await asyncio.wait_for(written.code(), 5) == grpc.StatusCode.OK
        await eventually(lambda: server.streams.open == 0)
    stop.set()
    await asyncio.wait_for(task, 5)


async def test_start_before_run_is_not_repeated() -> None:
    server = GrpcServer("127.0.0.1:0", [], [SERVICE], grace=0.1)
    port = await server.start()
    stop = asyncio.Event()
    stop.set()

    await asyncio.wait_for(server.run(stop), 5)

    assert port == server.port > 0
