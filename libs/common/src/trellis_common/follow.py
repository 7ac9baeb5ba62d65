"""Following a watch stream for as long as a service runs.

Every follower in Trellis (the catalog following providers and certmanager, proxy-cp
following the catalog and certmanager) does the same thing around its own logic: open the
stream, resync in full, apply changes; when the stream breaks, log it once, wait with
backoff (jittered, capped), and start again. :func:`follow_forever` is that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable

import grpc

log = logging.getLogger(__name__)


async def follow_forever(
    session: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    what: str,
    on_lost: Callable[[], None] = lambda: None,
    initial: float = 0.1,
    maximum: float = 2.0,
) -> None:
    """Run ``session`` (one stream, opened to ended) again until ``stop`` is set.

    A session that ends cleanly starts the next one after ``initial``; one that fails with
    a gRPC error waits twice as long as the previous failure did, up to ``maximum``.
    """
    delay = initial
    while not stop.is_set():
        try:
            await session()
            delay = initial
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "stream.lost what=%s code=%s details=%r", what, exc.code().name, exc.details()
            )
        on_lost()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay * (1 + 0.2 * random.random()))
        delay = min(delay * 2, maximum)
