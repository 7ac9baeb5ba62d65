"""Replicas of endpoints-vm: each follows the others' changes on the ``workloads`` topic.

Any replica takes a registration, a deregistration or a heartbeat (locally they share one
port, in a cluster one Service), and the catalog reads whichever replica it follows. So
that every replica answers the same, each one signals what it changed on
:data:`~trellis_endpoints_vm.manager.MIRROR` (key: the workload id) and follows that topic
with a :class:`WorkloadFollower`:

* ``changed``: a registration or deregistration. The workload is read back from Redis,
  where the replica that took it wrote it before answering (the signal carries no state:
  the read after the last signal reads the last state).
* ``expired``: the leader judged its TTL passed (only the leader judges:
  :meth:`~trellis_endpoints_vm.manager.EndpointsManager.expire_once`).
* ``revived``: a heartbeat brought it back, at the replica that heard it.

A replica that is alone sends none of these (:class:`~.mirroring.Peers`): ``hello`` (a
replica's subscription is up) and any signal of another tell it it is not, and it answers a
newcomer with ``joined``, on which the newcomer reads every workload back. A replica's own
signals come back to it and are skipped. After missed signals (a
reconnect, a revision gap) the follower reads every workload back
(:meth:`~trellis_endpoints_vm.manager.EndpointsManager.mirror_all`). Plain heartbeats are
not signalled (one per workload per interval would be most of the traffic): they reach
Redis's heartbeat hash, where the leader reads them before it judges.

What a replica does with another's change is what it does with its own: its views change
and it pushes them to the watches it serves (``WatchServices``), so whichever replica the
catalog watches answers the same once the signals have passed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trellis_endpoints_vm.manager import CHANGED, EXPIRED, MIRROR, REVIVED, EndpointsManager
from trellis_endpoints_vm.mirroring import HELLO, JOINED, Peers
from trellis_runtime.events import Follower
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)


class WorkloadFollower(Follower):
    """One replica following the others (see the module docstring)."""

    topics = (MIRROR,)

    def __init__(
        self, manager: EndpointsManager, instance: str, peers: Peers | None = None
    ) -> None:
        super().__init__("replicas")
        self._manager = manager
        self._instance = instance
        self._peers = peers

    async def resync(self, topic: str) -> None:
        changed = await self._manager.mirror_all()
        log.info("replicas.resynced views_changed=%d", changed)
        if self._peers is not None:
            await self._peers.hello()

    async def changed(self, event: Event) -> None:
        await self.changed_all([event])

    async def changed_all(self, events: Sequence[Event]) -> None:
        """Verdicts in order, and one read-back of every workload that changed."""
        reread: list[str] = []
        for event in events:
            if event.sender == self._instance:
                continue
            if self._peers is not None:
                await self._peers.heard(event.sender)
            if event.kind == CHANGED:
                reread.append(event.key)
            elif event.kind in (EXPIRED, REVIVED):
                await self._manager.mirror(reread)
                reread = []
                await self._manager.verdict(event.key, alive=event.kind == REVIVED)
            elif event.kind == JOINED:
                if event.key == self._instance:  # what it did not signal is in the store
                    changed = await self._manager.mirror_all()
                    log.info("replicas.resynced views_changed=%d reason=joined", changed)
            elif event.kind != HELLO:  # a hello is only heard
                log.warning("replicas.unknown_signal kind=%s key=%s", event.kind, event.key)
        if reread:
            await self._manager.mirror(reread)
