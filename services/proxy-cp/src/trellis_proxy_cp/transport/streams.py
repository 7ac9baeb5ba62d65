"""What the two ADS servers (state of the world and delta) share about a proxy's stream.

* :class:`Authorizer` decides, once per stream and before anything is sent, who the proxy is
  and which snapshot key it gets, from the peer (certificate) and the node of the first
  request. It refuses with :class:`StreamRefused`, whose gRPC code and message the servers
  abort the stream with.
* :class:`ProxyStream` is one open stream: identity plus per-type bookkeeping
  (:class:`TypeState`) that the servers update and the admin API reads.
* :class:`~.streamhooks.StreamHooks` (:mod:`.streamhooks`) is how the rest of proxy-cp
  learns what happens on streams.
* :class:`StreamRegistry` holds the open streams by id.
* :class:`StreamRunner` is the lifecycle both servers share. It reads the first request
  (which must carry a node, whose metadata is checked against :mod:`.limits` before anyone
  parses it), authorizes once, ends the proxy's oldest stream if this one is one too many,
  registers the stream, then runs two tasks: a reader feeding requests to the protocol's
  :class:`Machine`, and a writer draining a bounded outbox into the gRPC stream; snapshot
  changes of the stream's key reach the machine as callbacks from the event loop
  (``SnapshotSource.subscribe``: a task per stream fewer, which is memory at 5,000 streams);
  the outbox and the writer are :mod:`.writer`'s.
  The machine's handlers are synchronous, so requests and snapshot changes never interleave
  inside one. Whichever ends first ends the stream:
  the client half-closing is a clean end, a failure is logged and the stream aborted with
  its status, a full outbox (a client that stopped reading) ends the stream with
  RESOURCE_EXHAUSTED as Linkerd does rather than buffering without bound. Every request's
  names are checked against :mod:`.limits`. Nothing in one stream can affect another. Every
  refusal, before or after the stream opened, is logged with the proxy id and reported to
  ``StreamHooks.on_refused``. :meth:`StreamRunner.end` ends open streams from outside (a
  revoked certificate) the same way a newer stream replaces an old one: at once, with the
  refusal's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol

import grpc

from trellis_proxy_cp.cache.store import SnapshotSource
from trellis_proxy_cp.transport import limits
from trellis_proxy_cp.transport.limits import LimitExceeded, StreamLimits
from trellis_proxy_cp.transport.streamhooks import SafeHooks, StreamHooks
from trellis_proxy_cp.transport.writer import Outbox, Writer
from trellis_proxy_cp.types import SHORT, TypeUrl

log = logging.getLogger(__name__)


class StreamRefused(Exception):
    """A refusal: the stream is aborted with ``code`` and ``message``. ``reason`` is a short
    fixed word for metrics (``not_expected``, ``too_many_names``...)."""

    def __init__(self, code: grpc.StatusCode, message: str, reason: str = "refused") -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason

    @classmethod
    def of(cls, exceeded: LimitExceeded) -> StreamRefused:
        return cls(exceeded.code, exceeded.message, exceeded.reason)


@dataclasses.dataclass(slots=True)
class TypeState:
    """One type URL on one stream, as the server sees it."""

    wildcard: bool = False
    names: frozenset[str] = frozenset()
    """Explicitly subscribed names (besides the wildcard, if any)."""
    sent_version: str | None = None
    """Version of the latest response sent (``system_version_info`` in delta)."""
    nonce: str = ""
    """Nonce of the latest response sent; requests with another non-empty nonce are stale."""
    acked_version: str | None = None
    nack_count: int = 0
    last_error: str | None = None


@dataclasses.dataclass(slots=True)
class ProxyStream:
    """One open ADS stream of one proxy. The authorizer fills the identity fields."""

    proxy_id: str
    """Who the proxy is, e.g. its certificate's common name; used in every log line."""
    key: str
    """The snapshot key whose resources this proxy gets."""
    node_id: str
    identity: str
    """The service identity the proxy acts for (e.g. its SPIFFE id)."""
    serial: str = ""
    """The serial of the certificate the proxy presented (lowercase hex)."""
    envoy_version: str = ""
    """The proxy's build (its Node's ``user_agent_build_version``, set by the server; the
    Node itself is not kept: its metadata may be kilobytes, times thousands of streams)."""
    protocol: str = ""
    """``"sotw"`` or ``"delta"`` (set by the server)."""
    stream_id: int = 0
    """Set by :meth:`StreamRegistry.add`."""
    opened_at: float = dataclasses.field(default_factory=time.time)
    types: dict[TypeUrl, TypeState] = dataclasses.field(default_factory=dict)

    def state(self, type_url: TypeUrl) -> TypeState:
        """The type's state, created on the proxy's first request for it."""
        found = self.types.get(type_url)
        if found is None:
            found = self.types[type_url] = TypeState()
        return found


class Authorizer(Protocol):
    async def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], node: Any
    ) -> ProxyStream:
        """Identify the proxy behind ``context`` and ``node``, or raise :class:`StreamRefused`."""
        ...


class StreamRegistry:
    """The open streams by stream id (both protocols), for the admin API and tests."""

    def __init__(self) -> None:
        self.streams: dict[int, ProxyStream] = {}
        self._by_proxy: dict[str, dict[int, ProxyStream]] = {}
        self._ids = itertools.count(1)

    def add(self, stream: ProxyStream) -> None:
        stream.stream_id = next(self._ids)
        self.streams[stream.stream_id] = stream
        self._by_proxy.setdefault(stream.proxy_id, {})[stream.stream_id] = stream

    def remove(self, stream: ProxyStream) -> None:
        self.streams.pop(stream.stream_id, None)
        of_proxy = self._by_proxy.get(stream.proxy_id)
        if of_proxy is not None:
            of_proxy.pop(stream.stream_id, None)
            if not of_proxy:
                del self._by_proxy[stream.proxy_id]

    def __len__(self) -> int:
        return len(self.streams)

    def __iter__(self) -> Iterator[ProxyStream]:
        return iter(list(self.streams.values()))

    def of_proxy(self, proxy_id: str) -> list[ProxyStream]:
        """The proxy's open streams, oldest first."""
        return list(self._by_proxy.get(proxy_id, {}).values())


def short(type_url: str) -> str:
    """``cds``, ``eds``... for log lines; other type URLs as they are."""
    return SHORT.get(TypeUrl(type_url), type_url)


@dataclasses.dataclass(frozen=True, slots=True)
class Outgoing:
    """A response queued for the writer, with what ``on_sent`` reports."""

    message: Any
    type_url: TypeUrl
    version: str


Send = Callable[[Outgoing], None]


class Machine(Protocol):
    """One protocol's state machine for one stream. Handlers are synchronous and ``send``;
    they raise :class:`StreamRefused` to end the stream."""

    def on_request(self, request: Any) -> None: ...
    def on_snapshot(self) -> None: ...


MachineFactory = Callable[[ProxyStream, Send], Machine]

#: How long an ending stream waits for the message being written before sending its status.
WRITE_GRACE = 1.0

_Context = grpc.aio.ServicerContext[Any, Any]


class StreamRunner:
    """Runs one ADS stream from the first request to the end; see the module docstring."""

    def __init__(
        self,
        source: SnapshotSource,
        authorizer: Authorizer,
        hooks: StreamHooks,
        registry: StreamRegistry,
        queue_size: int = 64,
        stream_limits: StreamLimits | None = None,
    ) -> None:
        self.source = source
        self.authorizer = authorizer
        self.hooks = SafeHooks(hooks)
        self.registry = registry
        self.queue_size = queue_size
        self.limits = stream_limits if stream_limits is not None else StreamLimits()
        self._replaced: dict[int, asyncio.Future[None]] = {}  # stream id -> fails to end it

    async def run(
        self,
        protocol: str,
        requests: AsyncIterator[Any],
        context: _Context,
        make_machine: MachineFactory,
    ) -> None:
        try:
            first = await anext(aiter(requests))
        except StopAsyncIteration:
            return
        if not first.HasField("node"):
            refused = StreamRefused(
                grpc.StatusCode.INVALID_ARGUMENT, "the first request needs a node", "no_node"
            )
            await self._refuse(protocol, context, None, refused)
        try:
            limits.check_node(first.node, self.limits)
        except LimitExceeded as exceeded:
            await self._refuse(protocol, context, first.node, StreamRefused.of(exceeded))
        stream = await self._authorize(protocol, context, first.node)
        stream.envoy_version, stream.protocol = envoy_version(first.node), protocol
        self._replace_oldest(stream.proxy_id, protocol)
        self.registry.add(stream)
        log.info(
            "ads.open protocol=%s proxy=%s key=%s node=%s stream=%d",
            protocol,
            stream.proxy_id,
            stream.key,
            stream.node_id,
            stream.stream_id,
        )
        self.hooks.on_open(stream)
        try:
            failure = await self._serve(stream, first, requests, context, make_machine)
        finally:
            self.registry.remove(stream)
            self.hooks.on_close(stream)
            log.info(
                "ads.close protocol=%s proxy=%s stream=%d",
                protocol,
                stream.proxy_id,
                stream.stream_id,
            )
        if failure is not None:
            await context.abort(failure.code, failure.message)

    async def _authorize(self, protocol: str, context: _Context, node: Any) -> ProxyStream:
        try:
            return await self.authorizer.authorize(context, node)
        except StreamRefused as refused:
            await self._refuse(protocol, context, node, refused)
        except Exception:
            log.exception(
                "ads.authorize_failed protocol=%s peer=%s node=%.128r",
                protocol,
                context.peer(),
                node.id,
            )
            internal = StreamRefused(grpc.StatusCode.INTERNAL, "authorization failed", "internal")
            await self._refuse(protocol, context, node, internal)
        raise AssertionError("unreachable: abort raises")

    async def _refuse(
        self, protocol: str, context: _Context, node: Any, refused: StreamRefused
    ) -> None:
        """Log, report and abort a stream refused before it opened (``abort`` raises)."""
        proxy_id = _claimed(context, node)
        log.warning(
            "ads.refused protocol=%s proxy=%.128r node=%.128r peer=%s code=%s reason=%s message=%r",
            protocol,
            proxy_id,
            node.id if node is not None else "",
            context.peer(),
            refused.code.name,
            refused.reason,
            refused.message,
        )
        self.hooks.on_refused(proxy_id, protocol, refused)
        await context.abort(refused.code, refused.message)

    def end(
        self, proxy_id: str, refused: StreamRefused, which: Callable[[ProxyStream], bool]
    ) -> int:
        """End the open streams of ``proxy_id`` that ``which`` picks with ``refused`` (each
        logged and counted as it ends); returns how many."""
        ended = 0
        for stream in self.registry.of_proxy(proxy_id):
            ending = self._replaced.get(stream.stream_id)
            if ending is not None and not ending.done() and which(stream):
                ending.set_exception(refused)
                ended += 1
        return ended

    def _replace_oldest(self, proxy_id: str, protocol: str) -> None:
        """Make room for one more stream of ``proxy_id``: end its oldest ones past the cap."""
        open_ = [
            s
            for s in self.registry.of_proxy(proxy_id)
            if (ending := self._replaced.get(s.stream_id)) is not None and not ending.done()
        ]
        for oldest in open_[: max(0, len(open_) - self.limits.max_streams_per_proxy + 1)]:
            refused = StreamRefused.of(limits.replaced(proxy_id, self.limits))
            log.warning(
                "ads.replaced protocol=%s proxy=%s stream=%d code=%s reason=%s",
                oldest.protocol,
                proxy_id,
                oldest.stream_id,
                refused.code.name,
                refused.reason,
            )
            self.hooks.on_refused(proxy_id, oldest.protocol or protocol, refused)
            self._replaced[oldest.stream_id].set_exception(refused)

    async def _serve(
        self,
        stream: ProxyStream,
        first: Any,
        requests: AsyncIterator[Any],
        context: _Context,
        make_machine: MachineFactory,
    ) -> StreamRefused | None:
        outbox = Outbox(self.queue_size)

        def send(item: Outgoing) -> None:
            if not outbox.put(item):
                raise StreamRefused(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, "the proxy is not reading its stream"
                )

        machine = make_machine(stream, send)
        loop = asyncio.get_running_loop()
        # the stream's end, whichever comes first: the reader's (the proxy half-closed, or a
        # request refused), the writer's failure, the refusal when a newer stream of the
        # proxy replaces it, or what handling a new snapshot raised (a full outbox). One
        # future and two done-callbacks: nothing else is held per stream while it is open.
        ended = self._replaced[stream.stream_id] = loop.create_future()

        def end_with(task: asyncio.Task[None]) -> None:
            if ended.done():
                return
            error = None if task.cancelled() else task.exception()
            if error is None:
                ended.set_result(None)
            else:
                ended.set_exception(error)

        def snapshot_moved() -> None:
            if ended.done():
                return
            try:
                machine.on_snapshot()
            except Exception as error:  # noqa: BLE001 (ends this stream, as a task's would)
                ended.set_exception(error)

        unsubscribe = self.source.subscribe(stream.key, snapshot_moved)
        loop.call_soon(snapshot_moved)  # the key may have a snapshot already
        writer = Writer(stream, outbox, context, self.hooks)
        writing = asyncio.create_task(writer.run())
        reading = asyncio.create_task(self._read(first, requests, machine))
        writing.add_done_callback(end_with)
        reading.add_done_callback(end_with)
        try:
            with contextlib.suppress(Exception):  # its reason is read from ``ended`` below
                await ended
        finally:
            unsubscribe()
            self._replaced.pop(stream.stream_id, None)
            # gRPC refuses to send the status while a message is still being sent
            # (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS): let a write finish, within bounds.
            if not writing.done():
                await writer.finish(WRITE_GRACE)
            for task in (reading, writing):
                task.cancel()
            await asyncio.gather(reading, writing, return_exceptions=True)
            if not ended.done():
                ended.cancel()
        error = ended.exception() if not ended.cancelled() else None
        if isinstance(error, LimitExceeded):
            error = StreamRefused.of(error)
        if isinstance(error, StreamRefused):
            log.warning(
                "ads.abort proxy=%s stream=%d code=%s reason=%s message=%r",
                stream.proxy_id,
                stream.stream_id,
                error.code.name,
                error.reason,
                error.message,
            )
            if error.reason != "replaced":  # reported when it was replaced
                self.hooks.on_refused(stream.proxy_id, stream.protocol, error)
            return error
        if error is not None:
            log.error("ads.stream_failed proxy=%s", stream.proxy_id, exc_info=error)
            return StreamRefused(grpc.StatusCode.INTERNAL, "internal error")
        return None

    async def _read(self, first: Any, requests: AsyncIterator[Any], machine: Machine) -> None:
        _check(first, self.limits)
        machine.on_request(first)
        del first  # not kept for the stream's life: its node may be kilobytes
        async for request in requests:
            _check(request, self.limits)
            machine.on_request(request)
            del request  # nor the last one while the stream idles (Envoy repeats its node)


def _check(request: Any, stream_limits: StreamLimits) -> None:
    if not request.type_url:
        raise StreamRefused(
            grpc.StatusCode.INVALID_ARGUMENT, "ADS requests need a type_url", "no_type_url"
        )
    limits.check_request(request, stream_limits)


def envoy_version(node: Any) -> str:
    """The Node's build: ``major.minor.patch`` of ``user_agent_build_version``, else its
    ``user_agent_version`` or ``user_agent_name`` ("" for none)."""
    if node is None:
        return ""
    build = node.user_agent_build_version.version
    if build.major_number or build.minor_number:
        return f"{build.major_number}.{build.minor_number}.{build.patch}"
    return str(node.user_agent_version or node.user_agent_name)


def _claimed(context: _Context, node: Any) -> str:
    """Who a stream not yet authorized claims to be: its certificate's common name, else its
    node id (for log lines and refusal counts, never for trust)."""
    names = list(context.auth_context().get("x509_common_name") or [])
    if names:
        return bytes(names[0]).decode(errors="replace")
    return str(node.id)[:128] if node is not None else ""
