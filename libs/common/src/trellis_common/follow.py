"""Following a watch stream for as long as a service runs.

Every follower in Trellis (the catalog following providers and certmanager, proxy-cp
following the catalog and certmanager) does the same thing around its own logic: open the
stream, resync in full, apply changes; when the stream breaks, log it, wait with backoff
(jittered, capped), and start again. :func:`follow_forever` is that loop.

Any exception ends only the session, never the loop: a gRPC error (the peer went away) is
logged as a warning, anything else (a bug, a record that slipped past validation) with
its traceback. Either way the follower's :class:`~trellis_common.health.Loop` is marked
down with the reason, which ``/readyz`` and ``trellis status`` show until the next session
reports ``up()``. Only cancellation and ``stop`` end the loop.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Generic, TypeVar

import grpc

from trellis_common.health import Loop, Loops

log = logging.getLogger(__name__)

T = TypeVar("T")


def describe(exc: BaseException) -> str:
    """A one-line reason for a failure, as status shows it."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def follow_forever(
    session: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    what: str,
    loop: Loop | None = None,
    on_lost: Callable[[], None] = lambda: None,
    initial: float = 0.1,
    maximum: float = 5.0,
) -> None:
    """Run ``session`` (one stream, opened to ended) again until ``stop`` is set.

    A session that ends cleanly starts the next one after ``initial``; one that fails waits
    twice as long as the previous failure did (with 20 % jitter), up to ``maximum``. The
    session reports ``loop.up()`` itself once it is synced.
    """
    delay = initial
    try:
        while not stop.is_set():
            try:
                await session()
                delay = initial
                reason = "stream ended"
            except grpc.aio.AioRpcError as exc:
                reason = describe(exc)
                log.warning("stream.lost what=%s reason=%r retry_in=%.2fs", what, reason, delay)
            except Exception as exc:  # a follower must outlive any one failure
                reason = describe(exc)
                log.exception("stream.failed what=%s reason=%r retry_in=%.2fs", what, reason, delay)
            if stop.is_set():
                break
            if loop is not None:
                loop.down(reason)
            on_lost()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay * (1 + 0.2 * random.random()))
            delay = min(delay * 2, maximum)
    finally:
        if loop is not None:
            loop.close()


async def next_or_stop(events: AsyncIterator[T], stop: asyncio.Event) -> T | None:
    """The next item of ``events``, or ``None`` once ``stop`` is set (or the stream ended)."""
    if stop.is_set():
        return None
    reading = asyncio.ensure_future(anext(events, None))
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({reading, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not reading.done():
        reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await reading
        return None
    return reading.result()


class StreamFollower(abc.ABC, Generic[T]):
    """The one way a service follows another's watch stream.

    A subclass says how to open the stream (:meth:`open`), how to resync in full once the
    stream's first message arrived (:meth:`resync`), and how to apply each later message
    (:meth:`apply`). This class does the rest: run a session per stream, report ``up`` on
    the service's :class:`~trellis_common.health.Loops` once synced, and restart with
    backoff after any failure (see :func:`follow_forever`). ``synced`` is set while the
    follower is in sync. A subclass that needs a channel per session overrides
    :meth:`session` (an async context manager around one stream).

    Records inside a message are the subclass's to validate: one bad record is rejected
    (``Health.rejections``) and skipped, never raised, so it cannot stop the stream.
    """

    def __init__(self, what: str, loops: Loops | None = None) -> None:
        self.what = what
        self.synced = asyncio.Event()
        self._loops = loops

    @abc.abstractmethod
    def open(self) -> AsyncIterable[T]:
        """Open the watch stream (a gRPC stream call); it is cancelled when the session ends."""

    @abc.abstractmethod
    async def resync(self, first: T) -> None:
        """Re-read the whole state, now that the stream is open and said hello."""

    @abc.abstractmethod
    async def apply(self, event: T) -> None:
        """Apply one later message of the stream."""

    def lost(self) -> None:
        """The stream broke: called before the next attempt."""

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        yield

    async def run(self, stop: asyncio.Event) -> None:
        loop = self._loops.register(self.what) if self._loops is not None else None

        def lost() -> None:
            self.synced.clear()
            self.lost()

        await follow_forever(
            lambda: self._session(stop, loop), stop, what=self.what, loop=loop, on_lost=lost
        )

    async def _session(self, stop: asyncio.Event, loop: Loop | None) -> None:
        async with self.session():
            stream = self.open()
            events = aiter(stream)
            try:
                first = await next_or_stop(events, stop)
                if first is None:
                    return
                await self.resync(first)
                self.synced.set()
                if loop is not None:
                    loop.up()
                while (event := await next_or_stop(events, stop)) is not None:
                    await self.apply(event)
            finally:
                cancel = getattr(stream, "cancel", None)
                if cancel is not None:
                    cancel()
