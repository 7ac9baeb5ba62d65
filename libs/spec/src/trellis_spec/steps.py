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
import contextlib
import gc
import time
from collections.abc import Generator, Iterator
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


@contextlib.contextmanager
def full_collections_paused() -> Iterator[None]:
    """No full (generation 2) collection while inside: the young generations are still
    collected, as often as ever.

    A full collection walks every object the collector tracks. While a big flush builds
    (millions of objects at five thousand services) it would run several times, each
    holding the event loop for hundreds of milliseconds between two steps; young
    collections take a few milliseconds. Outside, the thresholds are as they were, so the
    full collections the flush put off come after it (or nothing is left for them, once
    the flush's survivors are frozen)."""
    young, middle, full = gc.get_threshold()
    gc.set_threshold(young, middle, 2**30)
    try:
        yield
    finally:
        gc.set_threshold(young, middle, full)
