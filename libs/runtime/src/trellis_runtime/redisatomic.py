"""Atomic read-then-write on Redis without scripts: WATCH, then MULTI/EXEC.

No Trellis user may run Lua (its ACL has no ``EVAL``/``EVALSHA``/``SCRIPT``): a script runs
with every right its caller has, all at once, and is one more thing to audit. What the
scripts did is done with optimistic transactions instead: ``WATCH`` the key, read it,
decide, then ``MULTI``/``EXEC`` the writes; if anyone wrote the key in between, ``EXEC``
does nothing and the caller reads again (or gives up, for a compare-and-swap).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis.asyncio
from redis.exceptions import WatchError

T = TypeVar("T")

#: Attempts of a transaction that keeps losing to other writers before the error is raised.
MAX_ATTEMPTS = 50


def _bytes(value: bytes | str | None) -> bytes | None:
    if value is None:
        return None
    return value.encode() if isinstance(value, str) else bytes(value)


async def transact(
    client: redis.asyncio.Redis,
    key: str,
    body: Callable[[Any], Awaitable[T]],
    attempts: int = MAX_ATTEMPTS,
) -> T:
    """Run ``body(pipe)`` with ``key`` watched, retrying while someone else wrote it: the
    body reads through ``pipe`` (immediate mode), calls ``pipe.multi()``, queues its writes;
    they are executed here. Returns what the body returned."""
    async with client.pipeline(transaction=True) as pipe:
        for _ in range(attempts):
            try:
                await pipe.watch(key)
                result = await body(pipe)
                await pipe.execute()
                return result
            except WatchError:
                await pipe.reset()  # type: ignore[no-untyped-call]  # redis-py: untyped
                continue
    raise WatchError(f"{key}: still contended after {attempts} attempts")


async def swap(
    client: redis.asyncio.Redis,
    key: str,
    expected: bytes | str,
    new: bytes | str,
    field: str | None = None,
) -> bool:
    """Set ``key`` (the hash field ``field`` of it) to ``new`` if it still holds
    ``expected``; False if it does not, or if someone wrote it meanwhile."""
    want = _bytes(expected)
    async with client.pipeline(transaction=True) as pipe:
        try:
            await pipe.watch(key)
            current = await (pipe.hget(key, field) if field is not None else pipe.get(key))
            if _bytes(current) != want:
                return False
            pipe.multi()  # type: ignore[no-untyped-call]  # redis-py: untyped
            if field is not None:
                pipe.hset(key, field, new)
            else:
                pipe.set(key, new)
            await pipe.execute()
        except WatchError:
            return False
    return True
