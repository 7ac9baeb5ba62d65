"""Work in steps: a generator that yields between units of work and returns its result.

A full recompute at a thousand services takes hundreds of milliseconds; the catalog's
event loop must not stall that long (its gRPC API, admin server and followers share it).
The recompute's phases are written as generators: :func:`drain` runs one to the end at
once (tests, the benchmark, anything synchronous), and
:meth:`~trellis_catalog.catalog.Catalog.flush_in_steps` runs it a few milliseconds at a
time, giving the loop back in between. A phase yields only where the state other
coroutines read is consistent: what it computes is kept aside and committed in one go.
"""

from __future__ import annotations

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
