"""A recording signal sender: what a manager hands its outbox, for tests to read back.

certmanager announces its changes, and endpoints-vm tells its replicas, through a ``bell``: an
``async (kind, key) -> revision`` callable that is, in production, the service's
:class:`~trellis_runtime.events.Outbox`. Tests pass a :class:`Bell` instead, which records
each signal and numbers it as the outbox would (1, 2, ...), and can stand in for a broken
road: ``failing`` raises, ``open`` cleared holds every signal (a frozen Redis).
"""

from __future__ import annotations

import asyncio


class Bell:
    """Records ``(kind, key)`` per signal."""

    def __init__(self) -> None:
        self.rung: list[tuple[str, str]] = []
        self.failing = False
        self.open = asyncio.Event()
        self.open.set()

    async def __call__(self, kind: str, key: str) -> int:
        await self.open.wait()
        if self.failing:
            raise RuntimeError("a bug in the signal's road")
        self.rung.append((kind, key))
        return len(self.rung)
