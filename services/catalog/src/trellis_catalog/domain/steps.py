"""Work in steps: a generator that yields between units of work and returns its result.

A full recompute at a thousand services takes hundreds of milliseconds; the catalog's
event loop must not stall that long (its gRPC API, admin server and followers share it).
The recompute's phases are written as generators: :func:`drain` runs one to the end at
once (tests, the benchmark, anything synchronous), and :func:`run_in_steps` (as
:meth:`~trellis_catalog.catalog.Catalog.flush_in_steps` uses it) a few milliseconds at a
time, giving the loop back in between. A phase yields only where the state other
coroutines read is consistent: what it computes is kept aside and committed in one go.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")
Steps = Generator[None, None, T]  # work in steps, its result at the end


def drain(steps: Steps[T]) -> T:
    """Run ``steps`` to the end at once; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result


async def run_in_steps(steps: Steps[T], budget: float) -> T:
    """Run ``steps`` to the end, giving the event loop back whenever ``budget`` seconds of
    work have passed since it last did; its result."""
    resumed = time.perf_counter()
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: T = done.value
            return result
        if time.perf_counter() - resumed > budget:
            await asyncio.sleep(0)
            resumed = time.perf_counter()
