"""gRPC scaffolding shared by every service: one ``grpc.aio`` server per process.

A :class:`GrpcServer` carries the standard health service (one status per gRPC service name
plus the overall ``""``), so Kubernetes probes work against any Trellis service, and, only
when asked (the ``debug_endpoints`` setting), server reflection for ``grpcurl``: it lists
every service and message type to whoever can connect. It runs as ``async def run(stop)``:
it serves until ``stop`` is set, then marks itself NOT_SERVING, ends every open response
stream at once (:class:`ResponseStreams`: UNAVAILABLE, so that its client reconnects, to
another replica where there is one) and drains the other in-flight calls for ``grace``
seconds. A response stream may send an answer serialized already (``bytes``): a watch that
sends one answer to many encodes it once.
:mod:`trellis_identity.tls` builds the credentials for mTLS.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha.reflection import SERVICE_NAME as REFLECTION_SERVICE
from grpc_reflection.v1alpha.reflection import enable_server_reflection as enable_reflection

from trellis_common.defaults import GRPC_OPTIONS

log = logging.getLogger(__name__)

Registration = Callable[[grpc.aio.Server], None]

#: Every server's options (:data:`trellis_common.defaults.GRPC_OPTIONS`).
DEFAULT_OPTIONS = GRPC_OPTIONS

#: The status message of a response stream ended because its server stops.
STOPPING = "the server is stopping: reconnect"

#: Streams left to the grace at stop: a health watcher is told NOT_SERVING on its stream.
LEFT_TO_GRACE = frozenset({"/grpc.health.v1.Health/Watch"})

Behavior = Callable[..., Any]
_Context = grpc.aio.ServicerContext[Any, Any]


class ResponseStreams(grpc.aio.ServerInterceptor):
    """Ends the server's open response streams when it stops, and lets them send answers
    serialized already.

    A watch (xDS, ``WatchChanges``, ``WatchServices``, the Destination API) never completes on
    its own, so a drain would only wait ``grace`` for it, then cancel it. :meth:`end` instead
    ends each at once with UNAVAILABLE and :data:`STOPPING`, as any replica that goes away
    does; one that opens afterwards is refused the same way. Each handler's own clean-up runs
    (it is cancelled where it waits). Unary calls are not touched: they are the drain's.

    An answer a stream yields or writes as ``bytes`` goes out as it is (the method's
    serializer is skipped): it must be the method's response message, serialized.
    """

    def __init__(self) -> None:
        self.stopping = False
        self._open: set[asyncio.Task[Any]] = set()
        self._ending: set[asyncio.Task[Any]] = set()

    @property
    def open(self) -> int:
        """How many response streams are open."""
        return len(self._open)

    def end(self) -> int:
        """End every open response stream; returns how many."""
        self.stopping = True
        for task in self._open - self._ending:
            self._ending.add(task)
            task.cancel()
        return len(self._ending)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None or not handler.response_streaming or details.method in LEFT_TO_GRACE:
            return handler
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._ended_on_stop(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=serialized_as_is(handler.response_serializer),
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._ended_on_stop(handler.stream_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=serialized_as_is(handler.response_serializer),
        )

    def _ended_on_stop(self, behavior: Behavior) -> Behavior:
        if inspect.isasyncgenfunction(behavior):

            async def generated(request: Any, context: _Context) -> Any:
                async with self._held(context):
                    async for item in behavior(request, context):
                        yield item

            return generated

        async def written(request: Any, context: _Context) -> Any:  # it calls context.write
            async with self._held(context):
                return await behavior(request, context)

        return written

    @contextlib.asynccontextmanager
    async def _held(self, context: _Context) -> AsyncIterator[None]:
        """One stream's life: registered while open, and ended by :meth:`end`."""
        task = asyncio.current_task()
        assert task is not None
        if self.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        self._open.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._ending:  # the client went away, or the grace ran out
                raise
            task.uncancel()
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        finally:
            self._open.discard(task)
            self._ending.discard(task)


def serialized_as_is(
    serializer: Callable[[Any], bytes] | None,
) -> Callable[[Any], bytes] | None:
    """``serializer``, but an answer serialized already (``bytes``) is sent as it is: for a
    registration outside a :class:`GrpcServer` too."""
    if serializer is None:
        return None
    encode = serializer

    def serialize(answer: Any) -> bytes:
        return answer if type(answer) is bytes else encode(answer)

    return serialize


class GrpcServer:
    """A grpc.aio server with health (and reflection if asked), started and stopped by ``run``."""

    def __init__(
        self,
        address: str,
        registrations: Sequence[Registration],
        service_names: Sequence[str],
        *,
        credentials: grpc.ServerCredentials | None = None,
        grace: float = 5.0,
        options: Sequence[tuple[str, int]] = DEFAULT_OPTIONS,
        reflection: bool = False,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    ) -> None:
        self._address = address
        self._service_names = tuple(service_names)
        self._credentials = credentials
        self._grace = grace
        self._reflection = reflection
        self.streams = ResponseStreams()
        self.server = grpc.aio.server(
            options=list(options), interceptors=[self.streams, *interceptors]
        )
        self.health = HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        for register in registrations:
            register(self.server)
        if reflection:
            enable_reflection(
                (
                    *self._service_names,
                    health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                    REFLECTION_SERVICE,
                ),
                self.server,
            )
        self.port = 0
        self.started = asyncio.Event()

    async def start(self) -> int:
        """Bind and start; returns the bound port (useful when the address ends in ``:0``)."""
        if self._credentials is None:
            self.port = self.server.add_insecure_port(self._address)
        else:
            self.port = self.server.add_secure_port(self._address, self._credentials)
        if self.port == 0:
            raise OSError(f"cannot bind gRPC server to {self._address}")
        await self.server.start()
        for name in ("", *self._service_names):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        host = self._address.rsplit(":", 1)[0]
        log.info(
            "grpc.listening address=%s:%d tls=%s reflection=%s",
            host,
            self.port,
            self._credentials is not None,
            self._reflection,
        )
        self.started.set()
        return self.port

    async def run(self, stop: asyncio.Event) -> None:
        if not self.started.is_set():
            await self.start()
        await stop.wait()
        await self.health.enter_graceful_shutdown()
        ended = self.streams.end()
        await self.server.stop(self._grace)
        log.info("grpc.stopped port=%d streams_ended=%d", self.port, ended)
