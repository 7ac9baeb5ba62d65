"""Wait for a condition instead of sleeping for a guessed time.

Tests of asynchronous behaviour poll a predicate until it holds or a bounded timeout
passes: they are as fast as the system under test, and fail with a message rather than
hang.

Unless the caller names an interval, the pause between two checks starts at 10 ms and grows
by half each time up to 100 ms: a condition that holds soon is seen soon, and a long wait
does not check 100 times a second. Most checks are requests to a service (a few ms of CPU
on each side), and at a fixed 10 ms a test waiting for a restart kept a third of a core
busy asking.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

#: The first pause between two checks, and the longest (when the caller names none).
FIRST_INTERVAL = 0.01
LONGEST_INTERVAL = 0.1

T = TypeVar("T")


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float | None = ...,
    message: str | None = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    timeout: float = ...,
    interval: float | None = ...,
    message: str | None = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float | None = None,
    message: str | None = None,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value, and return it:
    every ``interval`` seconds, or, without one, from 10 ms growing to 100 ms.

    Raises ``AssertionError`` after ``timeout`` seconds, naming the predicate (or
    ``message``) and its last value.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pause = FIRST_INTERVAL if interval is None else interval
    while True:
        result = predicate()
        value = await result if inspect.isawaitable(result) else result
        if value:
            return value
        if loop.time() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout}s: {what} (last: {value!r})")
        await asyncio.sleep(pause)
        if interval is None:
            pause = min(pause * 1.5, LONGEST_INTERVAL)


def wait_until(
    predicate: Callable[[], T | None], timeout: float = 5.0, message: str | None = None
) -> T:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    The synchronous counterpart of :func:`trellis_testing.waiting.eventually`: tests
    wait for a condition, never for a guessed time. Raises ``AssertionError`` naming the
    condition after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    pause = FIRST_INTERVAL  # growing to LONGEST_INTERVAL, as eventually() does
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout}s: {what} (last: {value!r})")
        time.sleep(pause)
        pause = min(pause * 1.5, LONGEST_INTERVAL)
