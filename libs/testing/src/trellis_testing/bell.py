"""A recording signal sender: what a manager hands its outbox, for tests to read back.

certmanager and endpoints-vm each announce their changes through a ``bell``: an
``async (kind, key) -> revision`` callable that is, in production, the service's
:class:`~trellis_runtime.events.Outbox`. Tests pass a :class:`Bell` instead, which records
each signal and numbers it as the outbox would (1, 2, ...), and can stand in for a broken
road: ``failing`` raises, ``open`` cleared holds every signal (a frozen Redis).
"""

from __future__ import annotations

import asyncio


class Bell:
    """Records ``(kind, key)`` per signal; ``rings(n)`` waits for the first ``n``."""

    def __init__(self) -> None:
        self.rung: list[tuple[str, str]] = []
        self.failing = False
        self.open = asyncio.Event()
        self.open.set()
        self._rang = asyncio.Condition()

    async def __call__(self, kind: str, key: str) -> int:
        await self.open.wait()
        if self.failing:
            raise RuntimeError("a bug in the signal's road")
        async with self._rang:
            self.rung.append((kind, key))
            self._rang.notify_all()
        return len(self.rung)

    async def rings(self, count: int) -> list[tuple[str, str]]:
        """The first ``count`` signals, once they came (at most a second)."""
        async with asyncio.timeout(1.0), self._rang:
            await self._rang.wait_for(lambda: len(self.rung) >= count)
        return self.rung[:count]
