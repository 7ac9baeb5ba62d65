"""Wait for a condition instead of sleeping for a guessed time.

Tests of asynchronous behaviour poll a predicate until it holds or a bounded timeout
passes: they are as fast as the system under test, and fail with a message rather than
hang.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def eventually(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
    message: str | None = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T],
    timeout: float = ...,
    interval: float = ...,
    message: str | None = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], Any],
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str | None = None,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value, and return it.

    Raises ``AssertionError`` after ``timeout`` seconds, naming the predicate (or
    ``message``) and its last value.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        value = await result if inspect.isawaitable(result) else result
        if value:
            return value
        if loop.time() >= deadline:
            what = message or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"condition not met within {timeout}s: {what} (last: {value!r})")
        await asyncio.sleep(interval)
