"""The replicas' signals: which workloads changed, on the :data:`~.manager.MIRROR` topic.

Each change a replica makes is signalled in the background, in the order of the changes:
the change is durable (stored) and served (pushed to the watches) already, and another
replica reads it back from the store whenever the signal lands
(:mod:`trellis_endpoints_vm.replicas`). A caller waits only while more than
:data:`SIGNALS_BEHIND` signals are on their way (a slow Redis: back-pressure, not a queue
that grows), and then at most the store timeout. A signal Redis does not take is kept by
the service's outbox.

A replica that is alone signals nothing (:class:`Peers`): a signal per change costs a
publish transaction (three round trips) and its own copy coming back, a fifth of the
service's work per registration, for nobody. It looks the other replicas up in the
registry, and hears them on the topic itself: a replica says ``hello`` each time its
subscription is up, and any signal of another is a sign of life. A replica that finds one
it did not know says ``joined`` to it, and the newcomer reads every workload back: what was
not signalled while the first thought itself alone is in the store, written before its
answer, and the read comes after the first learnt of the newcomer. While no lookup has
answered yet, a replica signals as if it had company.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from trellis_common.backoff import wait_or_stop

log = logging.getLogger(__name__)

#: ``signal(kind, key)``: publish (or keep) one signal of the MIRROR topic, e.g.
#: ``lambda kind, key: runtime.outbox.signal(MIRROR, kind, key)``.
Signal = Callable[[str, str], Awaitable[object]]
#: The replicas' signals a caller lets go ahead without waiting for them.
SIGNALS_BEHIND = 64
#: A replica whose subscription is up (key: its instance name).
HELLO = "hello"
#: A replica found another (key: the newcomer): the newcomer reads every workload back.
JOINED = "joined"
#: How often the registry is asked which replicas there are.
LOOKUP_INTERVAL = 5.0
#: How long a replica stays known after it was last heard of (signal or registry record).
GRACE = 30.0


class Signals:
    """Signals sent in the background, in order (``notify`` None: no replicas to tell)."""

    def __init__(
        self,
        notify: Signal | None,
        timeout: float,
        alone: Callable[[], bool] = lambda: False,
        skipped: Callable[[int], object] = lambda count: None,
    ) -> None:
        self._notify = notify
        self._timeout = timeout
        self._alone = alone
        self._skipped = skipped  # told how many signals it did not send: nobody to tell
        self._sending: set[asyncio.Task[None]] = set()  # in flight, some no longer awaited
        self._in_order = asyncio.Lock()  # FIFO: signals leave in the order of their changes

    async def send(self, mirrored: Sequence[tuple[str, str]]) -> None:
        """Send ``(kind, workload id)`` signals. Call it with no await since the changes
        were made, so the tasks are made, and take the order lock, in the changes' order."""
        if self._notify is None or not mirrored:
            return
        if self._alone():
            self._skipped(len(mirrored))
            return
        task = asyncio.get_running_loop().create_task(self._send_all(self._notify, mirrored))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        if len(self._sending) <= SIGNALS_BEHIND:
            return
        done, _ = await asyncio.wait({task}, timeout=self._timeout)
        if not done:
            log.warning(
                "replicas.signal_slow signals=%d first=%s waited=%ss action=continuing-behind",
                len(mirrored),
                mirrored[0][1],
                self._timeout,
            )

    async def _send_all(self, notify: Signal, mirrored: Sequence[tuple[str, str]]) -> None:
        async with self._in_order:
            for kind, workload_id in mirrored:
                try:
                    await notify(kind, workload_id)
                except Exception:  # the outbox keeps what Redis refuses: anything else is a bug
                    log.exception("replicas.signal_failed kind=%s workload=%s", kind, workload_id)

    async def sent(self) -> None:
        """Wait until every signal sent so far has been published or kept."""
        while self._sending:
            await asyncio.wait(set(self._sending))


class Peers:
    """The other replicas of this one, by instance name (see the module docstring).

    ``lookup()`` lists the replicas the registry holds (this one included, or not);
    ``announce(kind, key)`` publishes on the MIRROR topic (the outbox keeps what Redis
    refuses)."""

    def __init__(
        self,
        instance: str,
        lookup: Callable[[], Awaitable[Iterable[str]]],
        announce: Signal,
        *,
        grace: float = GRACE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instance = instance
        self._lookup = lookup
        self._announce = announce
        self._grace = grace
        self._clock = clock
        self._seen: dict[str, float] = {}  # another replica: when it was last heard of
        self.known = False  # a lookup answered: until then, signal as if not alone
        self.welcomed = 0  # newcomers told to read everything back

    @property
    def others(self) -> list[str]:
        return sorted(self._seen)

    def alone(self) -> bool:
        """Whether no other replica needs this one's signals."""
        return self.known and not self._seen

    async def hello(self) -> None:
        """Say this replica listens (its subscription is up, everything read back)."""
        await self._announce(HELLO, self.instance)

    async def heard(self, peer: str) -> None:
        """Any signal of ``peer``: it is a replica, and it listens."""
        if peer == self.instance:
            return
        new = peer not in self._seen
        self._seen[peer] = self._clock()
        if new:
            await self._welcome(peer, "signal")

    async def refresh(self) -> None:
        """Ask the registry; a replica neither listed nor heard for ``grace`` is gone."""
        listed = set(await self._lookup()) - {self.instance}
        now = self._clock()
        for peer in [p for p, at in self._seen.items() if p not in listed]:
            if now - self._seen[peer] > self._grace:
                del self._seen[peer]
                log.info("replicas.peer_gone peer=%s others=%d", peer, len(self._seen))
        # before the first answer every change was signalled: only later ones need welcomes
        new = sorted(listed - set(self._seen)) if self.known else []
        self._seen.update(dict.fromkeys(listed, now))
        if not self.known:
            self.known = True
            log.info("replicas.looked_up others=%d signalling=%s", len(listed), bool(listed))
        for peer in new:
            await self._welcome(peer, "registry")

    async def run(self, stop: asyncio.Event, interval: float = LOOKUP_INTERVAL) -> None:
        """Ask the registry every ``interval``; a failed lookup raises (the service
        restarts the loop with backoff) and what was known stays known."""
        while not stop.is_set():
            await self.refresh()
            await wait_or_stop(stop, interval)

    async def _welcome(self, peer: str, how: str) -> None:
        self.welcomed += 1
        log.info("replicas.peer_joined peer=%s via=%s others=%d", peer, how, len(self._seen))
        await self._announce(JOINED, peer)
