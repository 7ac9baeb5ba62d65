"""Process lifecycle: run a service's components under one TaskGroup until SIGTERM.

Every long-running part of a service is ``async def run(stop)``. :func:`run_components`
starts them together; when a signal arrives, or any component fails, ``stop`` is set and
the others wind down. :func:`main` wraps that for a console script.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence

from trellis_common.backoff import Backoff, RetryCallState, failure, retrying, start_over
from trellis_runtime.health import Loops

log = logging.getLogger(__name__)

Component = Callable[[asyncio.Event], Awaitable[None]]


async def run_components(components: Sequence[Component], stop: asyncio.Event) -> None:
    """Run all components; the first failure stops the rest and is re-raised."""

    async def guarded(component: Component) -> None:
        try:
            await component(stop)
        except BaseException:
            stop.set()
            raise

    async with asyncio.TaskGroup() as group:
        for component in components:
            group.create_task(guarded(component))


def supervised(
    name: str,
    component: Component,
    loops: Loops,
    *,
    initial: float = 0.2,
    maximum: float = 10.0,
) -> Component:
    """``component``, restarted with jittered backoff whenever it fails.

    Each failure in a row waits twice as long as the one before, from ``initial`` up to
    ``maximum``; a run that lasted ``maximum`` or longer starts the count again.

    It is reported on ``loops`` as ``name``: up while it runs, down with the reason from a
    failure until its next start. A component that watches something for the whole life of
    the service (a spec directory, a sweep, a discovery loop) thus never dies silently and
    never takes the service down with it. One that returns has nothing (more) to do: it
    leaves the table.
    """
    backoff = Backoff(initial, maximum, jitter=0.2)

    async def run(stop: asyncio.Event) -> None:
        loop = loops.register(name)
        clock = asyncio.get_running_loop()

        def failed(state: RetryCallState) -> None:
            error = failure(state)
            log.error(
                "component.failed component=%r retry_in=%.2fs",
                name,
                state.upcoming_sleep,
                exc_info=error,
            )
            loop.down(f"{type(error).__name__}: {error}")

        try:
            async for attempt in retrying(stop, backoff, before_sleep=failed):
                if stop.is_set():
                    break
                loop.up()
                started = clock.time()
                with attempt:
                    try:
                        await component(stop)
                    finally:
                        if clock.time() - started >= maximum:
                            start_over(attempt)  # it ran well for a while: a new streak
                    log.debug("component.done component=%r", name)
        finally:
            loop.close()

    return run


async def first(*waits: Awaitable[object]) -> None:
    """Wait until the first of ``waits`` is done (typically some event, or ``stop``);
    the others are cancelled, and awaited, so none outlives the call."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def every(
    stop: asyncio.Event, interval: float, step: Callable[[], Awaitable[object]], what: str
) -> None:
    """Run ``step`` now and then every ``interval`` seconds until ``stop``. A step that
    fails is logged (``<what>.failed``) and the next one runs on time: a periodic sweep
    never dies of one bad pass."""
    while not stop.is_set():
        try:
            await step()
        except Exception:
            log.exception("%s.failed", what)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


def freeze_startup_heap() -> None:
    """Put what start-up made (modules, settings, what was loaded) out of the cyclic
    collector's sight, its garbage collected first so none is kept for good: a full
    collection then scans only what is newer. Call it once everything long-lived is made,
    before serving. Refcounting still frees frozen objects; only a cycle among them would
    wait. endpoints-vm's full collections under 100 registrations/s took 78 ms (98,000
    objects) every 40 s or so, and every call in that window waited them out."""
    gc.collect()
    gc.freeze()


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, _on_signal, sig, stop)


def _on_signal(sig: signal.Signals, stop: asyncio.Event) -> None:
    log.info("service.signal signal=%s", sig.name)
    stop.set()


def main(service: Callable[[asyncio.Event], Awaitable[None]]) -> int:
    """Run ``service(stop)`` with signal handling; returns a process exit code."""

    async def runner() -> None:
        stop = asyncio.Event()
        install_signal_handlers(stop)
        await service(stop)

    try:
        asyncio.run(runner())
    except BaseExceptionGroup as group:
        for exc in group.exceptions:
            log.error("service.failed error=%r", exc, exc_info=exc)
        return 1
    except Exception:
        log.exception("service.failed")
        return 1
    return 0
