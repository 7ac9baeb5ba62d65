"""Helpers for tests that receive signaling events: a recording receiver, a running subscriber.

``RecordingReceiver`` is what a real receiver would be (its callbacks re-read state), reduced
to a log of what it was told; it can be told to fail its next callbacks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from trellis_runtime.signaling import Event
from trellis_runtime.subscriber import Subscriber
from trellis_testing.waiting import eventually


class CallbackFailure(RuntimeError):
    """Raised by a RecordingReceiver told to fail."""


class RecordingReceiver:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.resyncs: list[str] = []
        self.fail_events = 0  # how many of the next on_event calls raise
        self.fail_resyncs = 0  # how many of the next on_resync calls raise

    async def on_event(self, event: Event) -> None:
        self.events.append(event)
        if self.fail_events > 0:
            self.fail_events -= 1
            raise CallbackFailure(f"on_event told to fail at {event}")

    async def on_resync(self, topic: str) -> None:
        self.resyncs.append(topic)
        if self.fail_resyncs > 0:
            self.fail_resyncs -= 1
            raise CallbackFailure(f"on_resync told to fail for {topic}")

    def revisions(self, topic: str | None = None) -> list[int]:
        return [e.revision for e in self.events if topic is None or e.topic == topic]


@contextlib.asynccontextmanager
async def running(
    subscriber: Subscriber, timeout: float = 5.0
) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``subscriber`` until the block ends; enter once it has subscribed and resynced."""
    stop = asyncio.Event()
    task = asyncio.create_task(subscriber.run(stop))
    try:
        await eventually(lambda: subscriber.ready.is_set() or task.done(), timeout=timeout)
        if task.done():
            task.result()
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout)
