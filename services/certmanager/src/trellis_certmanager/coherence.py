"""Each certmanager replica follows what the others change, to keep its memory current.

Every replica serves reads from memory (:mod:`trellis_certmanager.replicas`), and any
replica may issue, rotate, revoke or prune. Each one announces its changes on the
``certificates`` topic (kinds ``issued``, ``rotated``, ``revoked``, ``root-changed``; key:
the common name) and operators' revocations of component certificates on ``identities``
(kind ``revoked``). :class:`ReplicaFollower` is a
:class:`~trellis_runtime.events.Follower` of both, on the service's one signals hub, as any
consumer is:

- ``issued``/``rotated``/``revoked`` of a common name: that name's record is read again
  from the store (or dropped, when it is gone), and on ``revoked`` the revoked set too;
- ``identities``: the issued and revoked component certificates are read again (this
  replica's authorizer refuses a revoked serial, whichever replica revoked it);
- ``root-changed`` or a resync (start, reconnect, gap in revisions): everything is read
  again.

So memory is stale no longer than a signal takes to arrive; the reads a consumer makes
right after a signal read through to the store anyway (:meth:`CertificateManager.lookup`,
:meth:`Revocations.current`). A replica's own signals come back to it too: reading again
what it just wrote is harmless. A failed read is raised: the hub marks this follower down
(``/readyz``, ``trellis status``) and the subscriber resyncs with backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from trellis_certmanager.componentcerts import ComponentCertificates
from trellis_certmanager.manager import TOPIC, CertificateManager
from trellis_runtime.events import Follower
from trellis_runtime.identityrevocation import IDENTITIES_TOPIC
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)

#: The kinds of ``certificates`` signals that name one common name.
ONE_NAME = ("issued", "rotated", "revoked")


class ReplicaFollower(Follower):
    """The ``certificates`` and ``identities`` signals of every replica (module docstring)."""

    topics = (TOPIC, IDENTITIES_TOPIC)

    def __init__(
        self, manager: CertificateManager, certs: ComponentCertificates | None = None
    ) -> None:
        super().__init__("replica signals")
        self._manager = manager
        self._certs = certs

    async def resync(self, topic: str) -> None:
        if topic == TOPIC:
            await self._manager.reload()
            log.info("replicas.reloaded records=%d", len(self._manager.records()))
        elif self._certs is not None:
            await self._certs.load()

    async def changed(self, event: Event) -> None:
        await self.changed_all([event])

    async def changed_all(self, events: Sequence[Event]) -> None:
        mine = [e for e in events if e.topic == TOPIC]
        if any(e.kind not in ONE_NAME for e in mine):  # root-changed, or one we do not know
            await self.resync(TOPIC)
        else:
            if any(e.kind == "revoked" for e in mine):
                await self._manager.revocations.load()
            for name in dict.fromkeys(e.key for e in mine):  # once per name
                await self._manager.refresh(name)
        if any(e.topic == IDENTITIES_TOPIC for e in events):
            await self.resync(IDENTITIES_TOPIC)
