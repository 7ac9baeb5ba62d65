"""Process lifecycle: run a service's components under one TaskGroup until SIGTERM.

Every long-running part of a service is ``async def run(stop)``. :func:`run_components`
starts them together; when a signal arrives, or any component fails, ``stop`` is set and
the others wind down. :func:`main` wraps that for a console script.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence

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
