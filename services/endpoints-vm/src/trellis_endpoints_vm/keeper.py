"""Keeping endpoints-vm's durable store in step with memory, across Redis outages.

The manager's memory is the registry in force; Redis holds its durable copy. Every write
to that copy goes through one :class:`StoreKeeper`:

* While the store is *available*, a registration's write happens at once and is bounded
  by ``timeout``: a frozen Redis costs a caller at most that long, once. A heartbeat's write
  is queued and written behind (:meth:`StoreKeeper.persist`), so it never waits on Redis.
* A write that fails or times out makes the store *unavailable* and queues the workload's
  id. While it is unavailable nothing waits on Redis: :meth:`StoreKeeper.persist` only
  queues, and :meth:`StoreKeeper.put`/:meth:`StoreKeeper.delete` raise
  :class:`StoreUnavailable` at once; the manager decides what that means for its caller.
* :meth:`StoreKeeper.run` probes Redis (PING, with backoff) and, once it answers, flushes
  the queue: for each queued id it writes the state memory holds *then* (the latest
  heartbeat, or a delete when the workload is gone). Ids are queued rather than values, so
  a later change supersedes an earlier one, and a write that timed out but landed anyway
  is corrected by the flush.
* After each recovery, and every ``check_interval``, it checks that Redis still holds every
  workload memory holds. A Redis that came back empty (or from an older copy) gets the
  missing registrations rewritten, as certmanager refills its records; with replicas, by
  the leader only.
* Heartbeats are written to the heartbeat hash only (the store's docstring says why), so a
  replica never rewrites a registration it may not know the latest of.

The store's state is a :class:`~trellis_runtime.health.Loop` (``workload-store``): down with
the reason and the number of queued writes while Redis is unavailable, so ``/readyz`` and
``trellis status`` say why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence

from redis.exceptions import RedisError

from trellis_common.backoff import DEFAULT_BACKOFF, Backoff, RetryCallState, failure, retrying
from trellis_endpoints_vm.domain.workloads import Workload
from trellis_endpoints_vm.store import CHUNK, WorkloadStore
from trellis_runtime.health import Loop, Loops

log = logging.getLogger(__name__)

LOOP_NAME = "workload-store"
#: A deregistration's tombstone is kept this long (replicas that missed the signal resync
#: long before), then pruned by the leader's periodic check.
TOMBSTONE_SECONDS = 86_400.0
#: At most this many tombstones are kept, the newest (about 8 MB of Redis): under heavy
#: churn (50 deregistrations a second is four million a day) the day is cut short, never
#: below the half hour that 100,000 of them last at that rate.
TOMBSTONE_LIMIT = 100_000
FAILURES = (RedisError, OSError, TimeoutError)


class StoreUnavailable(Exception):
    """The durable store did not take a write: Redis is down, frozen or refusing writes."""


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class StoreKeeper:
    def __init__(
        self,
        store: WorkloadStore,
        current: Callable[[str], Workload | None],
        known: Callable[[], Collection[str]],
        *,
        timeout: float = 2.0,
        check_interval: float = 5.0,
        extra: Callable[[], int] = lambda: 0,
        on_unavailable: Callable[[], None] = lambda: None,
        on_recovered: Callable[[], None] = lambda: None,
        backoff: Backoff = DEFAULT_BACKOFF,
        refills: Callable[[], bool] = lambda: True,
    ) -> None:
        self._store = store
        self._current = current
        self._known = known
        self._timeout = timeout
        self._check_interval = check_interval
        self._extra = extra
        self._on_unavailable = on_unavailable
        self._on_recovered = on_recovered
        self._backoff = backoff
        self._refills = refills  # with replicas, the leader alone restores a lost store
        self._io = asyncio.Lock()  # one write at a time, so a flush never overtakes a put
        self._wake = asyncio.Event()
        self._loop: Loop | None = None
        self.available = True
        self.reason = ""
        self.down_since = 0.0
        #: ids whose whole record memory holds is to be written (or deleted)
        self.rewrites: set[str] = set()
        #: ids whose heartbeat alone is to be written (the heartbeat hash: see the store)
        self.beats: set[str] = set()

    # -- writes ----------------------------------------------------------------------

    async def persist(self, workload_id: str) -> bool:
        """Queue memory's state of ``workload_id`` to be written behind (a heartbeat).

        Never waits on Redis: the keeper's loop writes queued ids in batches, at once while
        the store is available. Returns whether the store is available (False: the write
        waits for Redis to come back, and the caller should hold the workload alive).
        """
        if workload_id not in self.rewrites:
            self.beats.add(workload_id)
        self._wake.set()
        return self.available

    @property
    def pending(self) -> set[str]:
        """Every id with a write queued, whole record or heartbeat."""
        return self.rewrites | self.beats

    async def write(self, puts: Sequence[Workload], deletes: Sequence[str]) -> None:
        """Store ``puts`` and delete ``deletes`` now, in one write, or raise
        :class:`StoreUnavailable` (then nothing is known to be stored)."""
        ids = [w.id for w in puts] + list(deletes)
        if self.available:
            async with self._io:
                if self.available:
                    try:
                        async with asyncio.timeout(self._timeout):
                            await self._store.write(puts, deletes)
                    except FAILURES as exc:
                        self.rewrites.update(ids)  # the flush makes Redis match memory
                        self._fail(exc)
                    else:
                        self.rewrites.difference_update(ids)
                        self.beats.difference_update(ids)
                        return
        raise StoreUnavailable(self.explain())

    def explain(self) -> str:
        down_for = time.monotonic() - self.down_since
        return (
            f"Redis is unavailable ({self.reason}; for {down_for:.1f}s): nothing was stored; "
            "retry once Redis is back"
        )

    def _fail(self, exc: BaseException) -> None:
        if not self.available:
            return
        self.available = False
        self.reason = describe(exc)
        self.down_since = time.monotonic()
        log.warning("store.unavailable error=%r action=queueing-writes", self.reason)
        self._on_unavailable()
        self._report()
        self._wake.set()

    def _report(self) -> None:
        if self._loop is None:
            return
        if self.available and not self.rewrites and not self.beats:
            self._loop.up()
            return
        reason = f"redis unavailable: {self.reason}"
        if self._loop.is_up or self._loop.reason != reason:
            self._loop.down(reason)

    # -- the loop: probe, flush, refill ------------------------------------------------

    async def run(self, stop: asyncio.Event, loops: Loops | None = None) -> None:
        self._loop = loops.register(LOOP_NAME) if loops is not None else None
        self._report()
        next_check = time.monotonic() + self._check_interval
        try:
            while not stop.is_set():
                if not self.available:
                    await self._recover(stop)
                    next_check = time.monotonic() + self._check_interval
                    continue
                self._wake.clear()  # before the work: a write queued meanwhile wakes the wait
                delay = max(0.0, next_check - time.monotonic())
                try:
                    if self.rewrites or self.beats:  # writes behind: a batch at a time
                        await self.write_behind()
                    elif delay == 0.0:
                        await self.refill_if_lost()
                        next_check = time.monotonic() + self._check_interval
                        delay = self._check_interval
                except FAILURES as exc:
                    self._fail(exc)
                    continue
                except Exception as exc:  # a bug must not end the keeper: retried like an outage
                    log.exception("store.keeper_failed")
                    self._fail(exc)
                    continue
                await _either(stop, self._wake, delay)
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    async def _recover(self, stop: asyncio.Event) -> None:
        """:meth:`recover`, again with backoff until it succeeds (or ``stop`` is set)."""
        async for attempt in retrying(stop, self._backoff, before_sleep=self._still_down):
            if stop.is_set():
                break
            with attempt:
                await self.recover()

    def _still_down(self, state: RetryCallState) -> None:
        error = failure(state)
        if not isinstance(error, FAILURES):  # a bug must not end the keeper: retried like one
            log.error("store.keeper_failed", exc_info=error)
        self._fail(error)  # recover() may have found Redis, then lost it again

    async def recover(self) -> int:
        """Probe Redis, flush what is queued, then refill what it lost; returns flushed."""
        async with asyncio.timeout(self._timeout):
            await self._store.ping()
        flushed = await self.flush()
        if not self.available:
            down_for = time.monotonic() - self.down_since
            self.available, self.reason = True, ""
            log.info("store.recovered down_for=%.1fs flushed=%d", down_for, flushed)
            self._on_recovered()
        self._report()
        await self.refill_if_lost()
        return flushed

    async def write_behind(self) -> bool:
        """Write what is queued while the store is available; an outage makes it
        unavailable (and the manager hold its workloads). Returns whether all was written."""
        if not self.available:
            return False
        try:
            await self.flush()
        except FAILURES as exc:
            self._fail(exc)
            return False
        self._report()
        return True

    async def flush(self) -> int:
        """Write memory's state of every queued id, a chunk at a time: heartbeats first,
        then whole records (or deletes). A heartbeat only ever touches the heartbeat hash
        and needs no replica's acknowledgement, so a record write refused meanwhile (a new
        master without its replica yet) does not keep from the store the heartbeats the
        leader judges by. A record carries its heartbeat: an id queued whole is not beaten
        separately."""
        flushed = await self._flush_beats()
        while self.rewrites:
            async with self._io:
                batch = sorted(self.rewrites)[:CHUNK]
                self.rewrites.difference_update(batch)
                self.beats.difference_update(batch)  # the record carries its heartbeat
                puts, deletes = [], []
                for workload_id in batch:
                    workload = self._current(workload_id)
                    if workload is None:
                        deletes.append(workload_id)
                    else:
                        puts.append(workload)
                try:
                    async with asyncio.timeout(self._timeout):
                        await self._store.write(puts, deletes)
                except BaseException:
                    self.rewrites.update(batch)
                    raise
            flushed += len(batch)
        return flushed + await self._flush_beats()  # and those heard meanwhile

    async def _flush_beats(self) -> int:
        """Write the queued heartbeats of the ids not queued whole; returns how many."""
        flushed = 0
        while pending := self.beats - self.rewrites:
            async with self._io:
                batch = sorted(pending)[:CHUNK]
                self.beats.difference_update(batch)
                beats = [(w.id, w.last_heartbeat) for w in map(self._current, batch) if w]
                try:
                    async with asyncio.timeout(self._timeout):
                        await self._store.beat(beats)
                except BaseException:
                    self.beats.update(batch)
                    raise
            flushed += len(batch)
        return flushed

    async def refill_if_lost(self) -> int:
        """Rewrite the workloads Redis does not hold (it lost its data); returns how many.

        With replicas only the leader does (``refills``): a replica that has not yet heard
        of another's deregistration would otherwise put the workload back."""
        if not self._refills():
            return 0
        async with self._io:
            async with asyncio.timeout(self._timeout):
                await self._store.prune(TOMBSTONE_SECONDS, TOMBSTONE_LIMIT)
                missing = await self._store.missing(list(self._known()), self._extra())
            puts = [w for w in map(self._current, missing) if w is not None]
            if not puts:
                return 0
            log.warning("workloads.store_lost missing=%d action=restoring", len(puts))
            for start in range(0, len(puts), CHUNK):
                async with asyncio.timeout(self._timeout):
                    await self._store.write(puts[start : start + CHUNK])
            log.warning("workloads.store_restored count=%d", len(puts))
            return len(puts)


async def _either(first: asyncio.Event, second: asyncio.Event, timeout: float) -> None:
    """Wait until either event is set, or ``timeout`` seconds."""
    tasks = {asyncio.create_task(first.wait()), asyncio.create_task(second.wait())}
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
