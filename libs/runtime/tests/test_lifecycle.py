"""Running a service's components together: one failure or one stop ends them all."""

import asyncio
import gc
import logging
import os
import signal
import weakref

import pytest

from trellis_runtime import lifecycle
from trellis_testing import eventually


class Worker:
    """A component that runs until ``stop`` is set, and records how it ended."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped_cleanly = False

    async def run(self, stop: asyncio.Event) -> None:
        self.started.set()
        await stop.wait()
        self.stopped_cleanly = True


class Boom(RuntimeError):
    pass


async def test_all_components_stop_when_stop_is_set() -> None:
    workers = [Worker(), Worker(), Worker()]
    stop = asyncio.Event()

    running = asyncio.create_task(lifecycle.run_components([w.run for w in workers], stop))
    await asyncio.wait_for(asyncio.gather(*(w.started.wait() for w in workers)), 2)
    assert not running.done()

    stop.set()
    await asyncio.wait_for(running, 2)

    assert all(w.stopped_cleanly for w in workers)


async def test_components_that_finish_on_their_own_end_the_run() -> None:
    finished: list[str] = []

    async def once(_: asyncio.Event) -> None:
        finished.append("once")

    stop = asyncio.Event()
    await asyncio.wait_for(lifecycle.run_components([once, once], stop), 2)

    assert finished == ["once", "once"]
    assert not stop.is_set()


async def test_a_failure_stops_the_others_and_is_re_raised() -> None:
    workers = [Worker(), Worker()]

    async def failing(_: asyncio.Event) -> None:
        await asyncio.gather(*(w.started.wait() for w in workers))
        raise Boom("component failed")

    stop = asyncio.Event()
    with pytest.raises(ExceptionGroup) as caught:
        await asyncio.wait_for(
            lifecycle.run_components([workers[0].run, failing, workers[1].run], stop), 2
        )

    assert caught.group_contains(Boom, match="component failed")
    assert len(caught.value.exceptions) == 1
    assert stop.is_set()
    assert all(w.stopped_cleanly for w in workers)


async def test_a_component_that_ignores_stop_is_cancelled_after_a_failure() -> None:
    cancelled = asyncio.Event()

    async def stubborn(_: asyncio.Event) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def failing(_: asyncio.Event) -> None:
        await asyncio.sleep(0.01)
        raise Boom("component failed")

    with pytest.raises(ExceptionGroup) as caught:
        await asyncio.wait_for(lifecycle.run_components([stubborn, failing], asyncio.Event()), 2)

    assert caught.group_contains(Boom)
    assert cancelled.is_set()


def test_main_returns_0_for_a_service_that_finishes() -> None:
    ran: list[bool] = []

    async def service(stop: asyncio.Event) -> None:
        ran.append(stop.is_set())

    assert lifecycle.main(service) == 0
    assert ran == [False]


def test_main_returns_1_for_a_service_that_raises(caplog: pytest.LogCaptureFixture) -> None:
    async def service(_: asyncio.Event) -> None:
        raise Boom("cannot start")

    with caplog.at_level(logging.ERROR, logger=lifecycle.__name__):
        assert lifecycle.main(service) == 1

    assert [r.getMessage() for r in caplog.records] == ["service.failed"]
    assert caplog.records[0].exc_info is not None


def test_main_returns_1_for_a_failing_component(caplog: pytest.LogCaptureFixture) -> None:
    async def service(stop: asyncio.Event) -> None:
        async def failing(_: asyncio.Event) -> None:
            raise Boom("component failed")

        await lifecycle.run_components([Worker().run, failing], stop)

    with caplog.at_level(logging.ERROR, logger=lifecycle.__name__):
        assert lifecycle.main(service) == 1

    assert [r.getMessage() for r in caplog.records] == [
        "service.failed error=Boom('component failed')"
    ]


def test_main_stops_the_service_on_sigterm() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    seen: list[bool] = []

    async def service(stop: asyncio.Event) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(stop.wait(), 2)
        seen.append(stop.is_set())

    try:
        assert lifecycle.main(service) == 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [True]


async def test_a_supervised_component_is_restarted_and_reported() -> None:
    from trellis_runtime.health import Loops

    loops = Loops()
    stop = asyncio.Event()
    runs: list[str] = []

    async def watcher(halt: asyncio.Event) -> None:
        runs.append(loops.down().get("spec source", "up"))
        if len(runs) == 1:
            raise OSError("spec directory unreadable")
        if len(runs) == 2:
            raise RuntimeError("again")
        stop.set()

    component = lifecycle.supervised("spec source", watcher, loops, initial=0.001)
    await asyncio.wait_for(component(stop), timeout=5)

    # each run starts "up"; the reason of the previous failure is kept in restarts
    assert runs == ["up", "up", "up"]
    assert list(loops) == []  # the loop leaves the table once the service stops


async def test_a_supervised_component_is_down_with_the_reason_between_runs() -> None:
    from trellis_runtime.health import Loops

    loops = Loops()
    stop = asyncio.Event()
    seen: list[dict[str, str]] = []

    async def failing(halt: asyncio.Event) -> None:
        raise RuntimeError("boom")

    async def watch() -> None:
        await eventually(lambda: bool(loops.down()))
        seen.append(loops.down())
        stop.set()

    await asyncio.wait_for(
        asyncio.gather(lifecycle.supervised("sweep", failing, loops, initial=0.5)(stop), watch()),
        timeout=5,
    )
    assert seen == [{"sweep": "RuntimeError: boom"}]


async def test_a_supervised_component_that_returns_is_done() -> None:
    from trellis_runtime.health import Loops

    loops = Loops()
    runs: list[int] = []

    async def nothing_to_watch(halt: asyncio.Event) -> None:
        runs.append(1)

    await asyncio.wait_for(
        lifecycle.supervised("spec directory", nothing_to_watch, loops)(asyncio.Event()), 5
    )
    assert runs == [1]
    assert list(loops) == []


async def test_a_stop_during_the_restart_backoff_ends_the_component_at_once() -> None:
    from trellis_runtime.health import Loops

    loops = Loops()
    stop = asyncio.Event()
    runs: list[int] = []

    async def failing(halt: asyncio.Event) -> None:
        runs.append(1)
        raise RuntimeError("boom")

    # an hour between restarts: the test passes only if stop cuts the wait short
    component = lifecycle.supervised("sweep", failing, loops, initial=3600, maximum=3600)
    task = asyncio.ensure_future(component(stop))
    await eventually(lambda: bool(loops.down()))  # failed, now waiting to restart
    stop.set()
    await task
    assert runs == [1]
    assert list(loops) == []


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_freeze_startup_heap_collects_the_garbage_then_freezes_what_lives() -> None:
    """A cycle already garbage is collected, not kept for good; what lives is frozen."""
    kept, lost = Node(), Node()
    kept.other, lost.other = kept, lost  # two cycles; only ``kept`` stays referenced
    gone = weakref.ref(lost)
    del lost
    gc.disable()  # no collection of its own before the call's
    try:
        lifecycle.freeze_startup_heap()
        assert gone() is None
        assert gc.get_freeze_count() > 0
        assert not any(o is kept for o in gc.get_objects())  # out of the collector's sight
    finally:
        gc.unfreeze()
        gc.enable()


async def test_every_runs_its_step_until_stopped_and_a_failed_pass_is_logged_not_fatal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = asyncio.Event()
    passes: list[int] = []

    async def step() -> None:
        passes.append(len(passes))
        if len(passes) == 2:
            raise RuntimeError("one bad pass")
        if len(passes) == 4:
            stop.set()

    with caplog.at_level(logging.ERROR, logger="trellis_runtime.lifecycle"):
        await asyncio.wait_for(lifecycle.every(stop, 0.001, step, "sweep"), 5)
    assert passes == [0, 1, 2, 3]  # the pass after the failure ran, and the stop ended it
    assert [r.getMessage() for r in caplog.records] == ["sweep.failed"]
