"""The revoked proxy certificates: kept durably, listed to proxy-cp, pruned after expiry.

:class:`Revocations` is the manager's revoked set, by serial. An entry is written to the
store before it is served (a revocation Redis did not take is a
:class:`~trellis_certmanager.domain.errors.StoreUnavailable`, and nothing was revoked), and
deleted once the certificate it names has expired ``prune_after`` ago. Entries refused at
load (corrupt) are reported through ``rejections`` (source ``redis``) and left in Redis.

Every replica revokes, and every replica answers the revoked list: :meth:`Revocations.current`
reads it from the store on each call (proxy-cp asks right after a ``revoked`` signal,
which may reach it before it reaches this replica), and answers from memory only while
Redis is away. A revocation is written (and, with ``min_replicas_ack``, acknowledged by the
Redis replicas) before the caller is answered, so a failover loses none. Reading the store
never forgets a revocation held here that is not yet due for pruning: one missing from the
store was written a moment ago, or the store lost its data (the store guard writes it back).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable

from trellis_certmanager.claims import Claim
from trellis_certmanager.domain.errors import StoreUnavailable
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.domain.revocation import Revocation, RevocationReason, expired
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.store import CertificateStore
from trellis_runtime.health import Rejections
from trellis_runtime.stored import Refused

log = logging.getLogger(__name__)

REJECTION_SOURCE = "redis"


class Revocations:
    """The revoked serials (see the module docstring)."""

    def __init__(
        self,
        store: CertificateStore,
        metrics: CertMetrics,
        rejections: Rejections | None = None,
        *,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        grace: dt.timedelta = dt.timedelta(days=1),
    ) -> None:
        self._store = store
        self._clock = clock
        self._grace = grace  # a revocation is pruned once its certificate expired this ago
        self._metrics = metrics
        self._rejected = Refused(rejections, REJECTION_SOURCE)
        self._by_serial: dict[int, Revocation] = {}

    async def load(self) -> int:
        """Read the revoked set from the store (at start, and again on every listing); keep
        those held here that are not due for pruning (see the module docstring)."""
        loaded = await self._store.load_revoked()
        stored = {r.serial: r for r in loaded.records}
        held = [r for s, r in self._by_serial.items() if s not in stored]
        pruned = {r.serial for r in expired(held, self._clock(), self._grace)}
        self._by_serial = stored | {r.serial: r for r in held if r.serial not in pruned}
        for rejected in loaded.rejected:
            if rejected.field not in self._rejected:  # reported once, not at every load
                self._rejected.add(rejected)
        self._count()
        return len(self._by_serial)

    async def add(
        self,
        record: CertificateRecord,
        reason: RevocationReason,
        now: dt.datetime,
        claim: Claim | None = None,
    ) -> Revocation:
        """Revoke ``record``'s serial (durably first, under the common name's ``claim``);
        the same serial twice is one entry."""
        found = self._by_serial.get(record.serial)
        if found is not None:
            return found
        revocation = Revocation(record.serial, record.common_name, record.not_after, now, reason)
        await self._store.put_revoked(revocation, claim)
        self._by_serial[record.serial] = revocation
        self._metrics.revocations.labels(reason.value).inc()
        self._count()
        log.info(
            "cert.revoked cn=%s serial=%x reason=%s not_after=%s",
            record.common_name,
            record.serial,
            reason,
            record.not_after.isoformat(),
        )
        return revocation

    def __contains__(self, serial: object) -> bool:
        return serial in self._by_serial

    async def current(self, common_name: str = "") -> list[Revocation]:
        """:meth:`list`, as stored now (every replica's); from memory while Redis is away."""
        try:
            await self.load()
        except StoreUnavailable as exc:
            log.debug("cert.revocations_from_memory reason=%r", str(exc))
        return self.list(common_name)

    def list(self, common_name: str = "") -> list[Revocation]:
        """The revocations in force (of ``common_name`` only, if given), by serial."""
        return sorted(
            (
                r
                for r in self._by_serial.values()
                if not common_name or r.common_name == common_name
            ),
            key=lambda r: r.serial,
        )

    async def prune(self, now: dt.datetime, grace: dt.timedelta, claim: Claim | None = None) -> int:
        """Forget revocations of certificates expired ``grace`` ago; returns how many
        (``claim``: the rotation leader's fence)."""
        gone = expired(self._by_serial.values(), now, grace)
        if not gone:
            return 0
        await self._store.delete_revoked([r.serial for r in gone], claim)
        for revocation in gone:
            self._by_serial.pop(revocation.serial, None)
        self._count()
        log.info("cert.revocations_pruned count=%d grace=%s", len(gone), grace)
        return len(gone)

    async def restore(self) -> None:
        """Write every revocation back (the store lost its data)."""
        for revocation in self._by_serial.values():
            await self._store.put_revoked(revocation)

    def _count(self) -> None:
        self._metrics.revoked.set(len(self._by_serial))
