"""The event loop lag probe: a stall of the loop shows in its histogram and its max."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from trellis_runtime.looplag import LoopLag
from trellis_testing.waiting import eventually


def _value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, name
    return value


async def test_a_held_loop_shows_as_lag() -> None:
    registry = CollectorRegistry()
    probe = LoopLag(registry, interval=0.005)
    stop = asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    await eventually(lambda: _value(registry, "trellis_event_loop_lag_seconds_count") >= 2)
    deadline = time.perf_counter() + 0.12
    while time.perf_counter() < deadline:  # hold the loop for 120 ms, as CPU work would
        pass
    await eventually(lambda: probe.peak >= 0.1)  # the probe's next wake-up was that late
    stop.set()
    await task
    assert _value(registry, "trellis_event_loop_lag_max_seconds") >= 0.1
    over = _value(registry, "trellis_event_loop_lag_seconds_count") - _value(
        registry, "trellis_event_loop_lag_seconds_bucket", le="0.1"
    )
    assert over >= 1  # in the histogram too: a wake-up 100 ms late or more


def test_the_max_is_over_the_window_only() -> None:
    registry = CollectorRegistry()
    probe = LoopLag(registry, window=10.0)
    probe.record(0.3, now=100.0)
    probe.record(0.01, now=101.0)
    assert _value(registry, "trellis_event_loop_lag_max_seconds") == 0.3
    probe.record(0.02, now=109.0)
    assert _value(registry, "trellis_event_loop_lag_max_seconds") == 0.3
    probe.record(0.005, now=111.0)  # the 0.3 at 100 s is out of the window
    assert _value(registry, "trellis_event_loop_lag_max_seconds") == 0.02
    probe.record(0.001, now=125.0)  # everything before 115 s is out
    assert _value(registry, "trellis_event_loop_lag_max_seconds") == 0.001
    assert _value(registry, "trellis_event_loop_lag_seconds_count") == 5
