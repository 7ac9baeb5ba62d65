"""A session run again for as long as a service runs, and the reason a failure shows.

Changes between services travel on the one event path (:mod:`trellis_runtime.events`). What
remains here is the loop for a long-lived session that is not a follower (the catalog's
certificate issuer): run it, and when it ends or fails, log it, wait with backoff
(jittered, capped: :mod:`trellis_common.backoff`), and start again. :func:`follow_forever`
is that loop.

Any exception ends only the session, never the loop: a gRPC error (the peer went away) is
logged as a warning, anything else (a bug, a record that slipped past validation) with
its traceback. Either way the follower's :class:`~trellis_runtime.health.Loop` is marked
down with the reason, which ``/readyz`` and ``trellis status`` show until the next session
reports ``up()``. Only cancellation and ``stop`` end the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from trellis_common.backoff import Backoff, RetryCallState, failure, retrying, start_over
from trellis_runtime.health import Loop

log = logging.getLogger(__name__)


class _Ended(Exception):
    """A session ended without an error (the peer closed the stream)."""


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

    A session that ends cleanly, or fails after running for ``maximum`` or longer, starts
    the next one after ``initial``; each failure in a row waits twice as long as the one
    before (jittered by 20 %), up to ``maximum``. The session reports ``loop.up()`` itself
    once it is synced.
    """

    def lost(state: RetryCallState) -> None:
        error = failure(state)
        if isinstance(error, _Ended):
            reason = "stream ended"
        elif isinstance(error, grpc.aio.AioRpcError):
            reason = describe(error)
            log.warning(
                "stream.lost what=%s reason=%r retry_in=%.2fs", what, reason, state.upcoming_sleep
            )
        else:  # a follower must outlive any one failure
            reason = describe(error)
            log.error(
                "stream.failed what=%s reason=%r retry_in=%.2fs",
                what,
                reason,
                state.upcoming_sleep,
                exc_info=error,
            )
        if loop is not None:
            loop.down(reason)
        on_lost()

    clock = asyncio.get_running_loop()
    try:
        async for attempt in retrying(
            stop,
            Backoff(initial, maximum, jitter=0.2),
            before_sleep=lost,
        ):
            if stop.is_set():
                break
            started = clock.time()
            with attempt:
                try:
                    await session()
                finally:
                    if clock.time() - started >= maximum:
                        start_over(attempt)  # it ran well for a while: a new streak
                start_over(attempt)  # it ended cleanly: the next one waits the first delay
                raise _Ended  # and it is started again, like a failed one
    finally:
        if loop is not None:
            loop.close()
