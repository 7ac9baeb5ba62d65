"""Keeping memory and the store in step, both ways: following it, refilling it, and its
records that cannot be served.

Memory follows the store: every replica's signals name the records to read again
(:meth:`StoreKeeping.refresh`, called by :mod:`trellis_certmanager.coherence`), and a resync
reads them all (:meth:`StoreKeeping.reload`). The store follows memory when it loses its
data (Redis came back empty): the store guard puts the CA back, then the records and
revocations held here (:mod:`trellis_certmanager.custody` decides whether the CA it finds is
ours; a planted one is refused, never adopted). The two never cross: a refresh or a reload
waits while the store is refilled, and neither reads a store that lost its CA as the truth,
which would drop from memory every record it is about to put back.

Redis outages: reads (get, list, an issue request the current certificate satisfies) come
from memory; a write Redis does not take fails with
:class:`~trellis_certmanager.domain.errors.StoreUnavailable` and changes nothing, and a
rotation pass that meets one stops until the next pass.

Corrupt state: records refused at load are reported through ``rejections`` (source
``redis``) and never served; re-issuing the same common name overwrites one,
:meth:`StoreKeeping.delete_rejected` removes one, and a refill forgets them (the store lost
them with the rest). Records that main finds it must never serve again (a service
certificate an earlier version issued in the control plane's namespace) are dropped at
start (:meth:`StoreKeeping.drop`).
"""

from __future__ import annotations

import asyncio

from trellis_certmanager.domain.errors import NotFound
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.ledger import CertificateLedger, log


class StoreKeeping(CertificateLedger):
    """The manager's calls that keep memory and the store in step (module docstring)."""

    async def drop(self, records: list[CertificateRecord], reason: str) -> None:
        """Delete ``records`` (at start: they are never served or rotated again)."""
        if records:
            await self._store.delete_many([r.common_name for r in records])
        for record in records:
            self._records.place(record.common_name, None)
            log.warning(
                "cert.dropped cn=%s serial=%x reason=%s", record.common_name, record.serial, reason
            )
        self._count()

    def rejected(self) -> list[str]:
        """Common names of stored records refused at load, still in the store."""
        return self._rejected.fields()

    async def delete_rejected(self, common_name: str) -> None:
        """Delete a stored record that was refused at load; ``NotFound`` for any other."""
        if common_name not in self._rejected:
            raise NotFound(common_name)
        async with self._records.exclusive(common_name) as claim:
            await self._store.delete_many([common_name], claim)
            self._rejected.overwritten(common_name)
            log.info("cert.rejected_record_deleted cn=%s", common_name)

    async def refresh(self, common_name: str) -> None:
        """Read ``common_name``'s record again: a signal (ours or a replica's) named it; not
        while the store is refilled (what it read from the wiped store would drop it)."""
        async with self._custody.restoring:
            await self._records.refresh(common_name)
        self._count()

    async def reload(self) -> None:
        """Read every record and revocation again (a resync of the signals); not from a
        store that lost its data (no CA), nor while it is refilled from memory."""
        async with self._custody.restoring:
            if await self._store.load_ca() is None:
                log.warning("cert.reload_skipped reason=store_lost_its_data")
                return
            await self._records.reload()
            await self.revocations.load()
        self._count()

    async def guard_store(self, stop: asyncio.Event, interval: float = 5.0) -> None:
        """Put the CA and records back if the store lost them (Redis came back empty);
        :class:`PlantedCA` if it holds another CA (see :mod:`trellis_certmanager.custody`)."""
        await self._custody.guard(stop, interval, lambda: self.ca, self._refill)

    async def restore_if_lost(self) -> bool:
        """One round of :meth:`guard_store`: True if the store had lost its data."""
        return await self._custody.restore_if_lost(self.ca, self._refill)

    async def _refill(self) -> None:
        """The store lost its data: write back the records and revocations held here."""
        await self._store.put_many(list(self._records.values()))
        await self.revocations.restore()
        for common_name in self._rejected.fields():  # the store lost them with the rest
            self._rejected.overwritten(common_name)
        held, fingerprint = len(self._records), self.ca.fingerprint
        log.warning("ca.store_restored fingerprint=%s records=%d", fingerprint, held)
