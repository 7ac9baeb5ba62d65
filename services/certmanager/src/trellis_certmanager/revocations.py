"""The revoked proxy certificates: kept durably, listed to proxy-cp, pruned after expiry.

:class:`Revocations` is the manager's revoked set, by serial. An entry is written to the
store before it is served (a revocation Redis did not take is a
:class:`~trellis_certmanager.domain.errors.StoreUnavailable`, and nothing was revoked), and
deleted once the certificate it names has expired ``prune_after`` ago. Entries refused at
load (corrupt) are reported through ``rejections`` (source ``redis``) and left in Redis.
"""

from __future__ import annotations

import datetime as dt
import logging

from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.domain.revocation import Revocation, RevocationReason, expired
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.store import CertificateStore
from trellis_common.health import Rejections
from trellis_common.stored import Refused

log = logging.getLogger(__name__)

REJECTION_SOURCE = "redis"


class Revocations:
    """The revoked serials (see the module docstring)."""

    def __init__(
        self, store: CertificateStore, metrics: CertMetrics, rejections: Rejections | None = None
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._rejected = Refused(rejections, REJECTION_SOURCE)
        self._by_serial: dict[int, Revocation] = {}

    async def load(self) -> int:
        loaded = await self._store.load_revoked()
        self._by_serial = {r.serial: r for r in loaded.records}
        for rejected in loaded.rejected:
            self._rejected.add(rejected)
        self._count()
        return len(self._by_serial)

    async def add(
        self, record: CertificateRecord, reason: RevocationReason, now: dt.datetime
    ) -> Revocation:
        """Revoke ``record``'s serial (durably first); the same serial twice is one entry."""
        found = self._by_serial.get(record.serial)
        if found is not None:
            return found
        revocation = Revocation(record.serial, record.common_name, record.not_after, now, reason)
        await self._store.put_revoked(revocation)
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

    async def prune(self, now: dt.datetime, grace: dt.timedelta) -> int:
        """Forget revocations of certificates expired ``grace`` ago; returns how many."""
        gone = expired(self._by_serial.values(), now, grace)
        if not gone:
            return 0
        await self._store.delete_revoked([r.serial for r in gone])
        for revocation in gone:
            del self._by_serial[revocation.serial]
        self._count()
        log.info("cert.revocations_pruned count=%d grace=%s", len(gone), grace)
        return len(gone)

    async def restore(self) -> None:
        """Write every revocation back (the store lost its data)."""
        for revocation in self._by_serial.values():
            await self._store.put_revoked(revocation)

    def _count(self) -> None:
        self._metrics.revoked.set(len(self._by_serial))
