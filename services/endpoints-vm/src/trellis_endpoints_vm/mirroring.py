"""The replicas' signals: which workloads changed, on the :data:`~.manager.MIRROR` topic.

Each change a replica makes is signalled in the background, in the order of the changes:
the change is durable (stored) and served (pushed to the watches) already, and another
replica reads it back from the store whenever the signal lands
(:mod:`trellis_endpoints_vm.replicas`). A caller waits only while more than
:data:`SIGNALS_BEHIND` signals are on their way (a slow Redis: back-pressure, not a queue
that grows), and then at most the store timeout. A signal Redis does not take is kept by
the service's outbox.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger(__name__)

#: ``signal(kind, key)``: publish (or keep) one signal of the MIRROR topic, e.g.
#: ``lambda kind, key: runtime.outbox.signal(MIRROR, kind, key)``.
Signal = Callable[[str, str], Awaitable[object]]
#: The replicas' signals a caller lets go ahead without waiting for them.
SIGNALS_BEHIND = 64


class Signals:
    """Signals sent in the background, in order (``notify`` None: no replicas to tell)."""

    def __init__(self, notify: Signal | None, timeout: float) -> None:
        self._notify = notify
        self._timeout = timeout
        self._sending: set[asyncio.Task[None]] = set()  # in flight, some no longer awaited
        self._in_order = asyncio.Lock()  # FIFO: signals leave in the order of their changes

    async def send(self, mirrored: Sequence[tuple[str, str]]) -> None:
        """Send ``(kind, workload id)`` signals. Call it with no await since the changes
        were made, so the tasks are made, and take the order lock, in the changes' order."""
        if self._notify is None or not mirrored:
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
