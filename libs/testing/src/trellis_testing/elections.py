"""Watching replicas contend in a leader election, for tests of the rule that matters most:
never two leaders at once (:mod:`trellis_kube.leadership`).

:class:`Contenders` samples every contender's ``leading`` (the property a replica's own
code reads) every few milliseconds while it is open, and records each change of role its
callbacks report, with the wall time. A test then asserts that no sample found two leaders
and compares the times with the lock's own timestamps (a Lease's ``renewTime``, a Redis
key's expiry).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from trellis_kube.leadership import Leadership
from trellis_testing.waiting import eventually


@dataclass
class Contenders:
    """Samples ``leaderships``; use as ``async with``."""

    leaderships: tuple[Leadership, ...]
    interval: float = 0.002
    samples: int = 0
    #: samples in which more than one contender was leading
    overlaps: list[tuple[float, tuple[str, ...]]] = field(default_factory=list)
    #: identity -> the last wall time it was sampled leading
    last_leading: dict[str, float] = field(default_factory=dict)
    #: (wall time, identity, leading, token) for each change a callback reported
    changes: list[tuple[float, str, bool, int]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        for leadership in self.leaderships:
            leadership.subscribe(self._recorder(leadership))

    def _recorder(self, leadership: Leadership) -> Callable[[bool], None]:
        def record(leading: bool) -> None:
            self.changes.append((time.time(), leadership.identity, leading, leadership.token))

        return record

    async def __aenter__(self) -> Contenders:
        self._task = asyncio.create_task(self._sample())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _sample(self) -> None:
        while True:
            now = time.time()
            leaders = tuple(x.identity for x in self.leaderships if x.leading)
            self.samples += 1
            for identity in leaders:
                self.last_leading[identity] = now
            if len(leaders) > 1:
                self.overlaps.append((now, leaders))
            await asyncio.sleep(self.interval)

    def stepped_down(self, identity: str) -> float:
        """When ``identity`` was last told it no longer leads (wall time)."""
        return max(t for t, who, leading, _ in self.changes if who == identity and not leading)

    def elected_tokens(self) -> list[int]:
        """The tokens of every election seen, in order."""
        return [token for _, _, leading, token in self.changes if leading]


async def leader_among(
    replicas: Sequence[Leadership], *, besides: Sequence[Leadership] = (), timeout: float = 10.0
) -> Leadership:
    """The replica that leads, once one (not among ``besides``) does."""
    found = await eventually(
        lambda: next((r for r in replicas if r.leading and r not in besides), None),
        timeout=timeout,
        message="a leader",
    )
    assert found is not None
    return found


@contextlib.asynccontextmanager
async def running(replica: Leadership) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
    """``replica``'s election loop, stopped at the end; the block gets its stop event (a
    clean stop) and its task (cancel it to kill the replica)."""
    stop = asyncio.Event()
    task = asyncio.create_task(replica.run(stop))
    try:
        yield stop, task
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@contextlib.asynccontextmanager
async def leader_and_standby(
    leader: Leadership, standby: Leadership
) -> AsyncIterator[tuple[asyncio.Event, asyncio.Task[None]]]:
    """``leader`` elected first, then ``standby`` running and seeing it lead; the block gets
    the leader's stop event and task."""
    async with running(leader) as (stop, task):
        assert await leader.wait_leading(asyncio.Event())
        async with running(standby):
            await eventually(lambda: standby.holder == leader.identity, message="observed")
            yield stop, task
