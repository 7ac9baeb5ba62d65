"""Shared pieces of every benchmark: timing loops, the figures table and the ratio lines.

The rule of this project: speed is shown by benchmarks that print figures AND ratios
against a floor or baseline measured in the same run, never by timed assertions in tests.
An absolute rate means little on its own (machines differ by 10x); the ratio to a
reference measured alongside it on the same machine is what a reader compares across
runs. So each benchmark measures its subjects and its references together with
:func:`measure_rates_async` (interleaved, so load on a shared machine hits all of them alike),
prints them with :func:`print_table`, and states each comparison with :func:`ratio_line`.

A benchmark is a callable ``run(*, seconds, warmup) -> dict[str, float]`` (the
:class:`Benchmark` protocol): it prints its report and returns the same figures and ratios
keyed by stable names, so a test can call it with tiny durations and check the shape.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

SyncOp = Callable[[], object]
AsyncOp = Callable[[], Awaitable[object]]
ROUNDS = 5


class Benchmark(Protocol):
    def __call__(self, *, seconds: float, warmup: float) -> dict[str, float]: ...


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured value: ``name`` is the stable key, ``note`` says what was measured."""

    name: str
    value: float
    unit: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class Timing:
    """How many operations ran in how long; ``rate`` is operations per second."""

    count: int
    elapsed: float

    @property
    def rate(self) -> float:
        return self.count / self.elapsed if self.elapsed > 0 else float("inf")


Runner = Callable[[float], Awaitable[Timing]]  # run for so many seconds, count the calls


def run_for(op: SyncOp, seconds: float) -> Timing:
    """Call ``op`` back to back for ``seconds`` (at least once); count the calls."""
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    count = 0
    while True:
        op()
        count += 1
        now = clock()
        if now >= deadline:
            return Timing(count, now - start)


async def run_for_async(op: AsyncOp, seconds: float) -> Timing:
    """:func:`run_for` for a coroutine function: one call in flight at a time."""
    clock = time.perf_counter
    start = clock()
    deadline = start + seconds
    count = 0
    while True:
        await op()
        count += 1
        now = clock()
        if now >= deadline:
            return Timing(count, now - start)


def sync_runner(op: SyncOp) -> Runner:
    """A plain function as a :data:`Runner`; it runs without awaiting, as it would alone."""

    async def runner(seconds: float) -> Timing:
        return run_for(op, seconds)

    return runner


def async_runner(op: AsyncOp) -> Runner:
    async def runner(seconds: float) -> Timing:
        return await run_for_async(op, seconds)

    return runner


async def measure_rates_async(
    runners: Mapping[str, Runner], seconds: float, warmup: float, rounds: int = ROUNDS
) -> dict[str, float]:
    """Operations per second of each runner, measured in interleaved rounds.

    Each runner first warms up for ``warmup`` seconds, then they take turns, ``rounds``
    times, ``seconds / rounds`` each: a shared machine that slows down halfway slows every
    subject alike, so the ratios between them hold even when the absolute figures drift.
    """
    for runner in runners.values():
        await runner(warmup)
    totals = dict.fromkeys(runners, Timing(0, 0.0))
    for _ in range(rounds):
        for name, runner in runners.items():
            timing = await runner(seconds / rounds)
            total = totals[name]
            totals[name] = Timing(total.count + timing.count, total.elapsed + timing.elapsed)
    return {name: total.rate for name, total in totals.items()}


def format_value(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:,.2f}"
    return f"{value:.4g}"


def print_table(title: str, figures: Sequence[Figure]) -> None:
    """A title line, then one aligned row per figure: name, value, unit, note."""
    print(title)
    if not figures:
        return
    values = [format_value(f.value) for f in figures]
    name_w = max(len(f.name) for f in figures)
    value_w = max(len(v) for v in values)
    unit_w = max(len(f.unit) for f in figures)
    for figure, value in zip(figures, values, strict=True):
        row = f"  {figure.name:<{name_w}}  {value:>{value_w}} {figure.unit:<{unit_w}}"
        if figure.note:
            row += f"  {figure.note}"
        print(row.rstrip())


def ratio_line(subject: Figure, reference: Figure, kind: str = "floor") -> float:
    """Print "<subject> is N.NNx the <kind> (<reference>) measured in this run"; return N."""
    value = subject.value / reference.value if reference.value else float("inf")
    print(f"  {subject.name} is {value:.2f}x the {kind} ({reference.name}) measured in this run")
    return value


def results(figures: Sequence[Figure], ratios: dict[str, float]) -> dict[str, float]:
    """What a benchmark returns: each figure by name, then each ratio by its key."""
    return {f.name: f.value for f in figures} | ratios


def growth(
    what: str, sizes: Sequence[int], series: Mapping[str, Sequence[float]]
) -> dict[str, float]:
    """Print how each of ``series`` (one value per size) grows with N against the first
    size, and fit the exponent k of N**k between the first and the last size
    (``<name>_exponent``: k near 1 is linear, near 2 quadratic) and between the last two
    (``<name>_exponent_top``: the top of the range, where fixed costs no longer hide the
    growth); returns those and each ``<name>_growth@<N>``."""
    base = sizes[0]
    print(f"{what} growth, against N={base:,} measured in this run")
    print(f"  {'N':>6} {'N growth':>9}" + "".join(f" {c:>17} {'growth':>8}" for c in series))
    results: dict[str, float] = {}
    for index, n in enumerate(sizes):
        row = f"  {n:>6,} {n / base:>8.2f}x"
        for name, values in series.items():
            ratio = values[index] / values[0] if values[0] else float("inf")
            results[f"{name}_growth@{n}"] = ratio
            row += f" {format_value(values[index]):>17} {ratio:>7.2f}x"
        print(row)
    spans = [("_exponent", 0)] if len(sizes) > 1 and sizes[-1] != base else []
    if len(sizes) > 2:
        spans.append(("_exponent_top", len(sizes) - 2))
    for suffix, start in spans:
        span = math.log(sizes[-1] / sizes[start])
        fits = []
        for name, values in series.items():
            exponent = math.log(values[-1] / values[start]) / span
            results[f"{name}{suffix}"] = exponent
            fits.append(f"{name} ~ N^{exponent:.2f}")
        print(f"  from N={sizes[start]:,} to N={sizes[-1]:,}: " + ", ".join(fits))
    return results
