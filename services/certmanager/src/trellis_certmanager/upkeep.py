"""Replacing and removing records: rotation, revocation and pruning, and the pass's hooks.

Rotation: what is due is rotated by the periodic pass (:mod:`trellis_certmanager.rotation`),
which also prunes; the calls it makes are here. Proxy certificates are issued for a CSR
(certmanager never has the key): the proxy renews its own through proxy-cp (:meth:`rotate`
with a ``renewal``), and an operator's rotation re-signs the same key. A proxy certificate
rotated revokes its old serial (reason ``rotated``). Rotation and pruning run on the
rotation leader only, and their writes are fenced with its token
(:mod:`trellis_certmanager.claims`): a leader deposed while paused cannot overwrite what a
newer one wrote, and a rotation asked for a given ``serial`` leaves alone a record that
another replica renewed meanwhile.

Revocation (:mod:`trellis_certmanager.revocations`): revoking a proxy certificate records its
serial as revoked and deletes the record (the proxy is no longer expected); rotating one
revokes the old serial. Both signal ``revoked`` (key: the common name), on which proxy-cp
closes the streams opened with a revoked serial.

Pruning: a record ``prune_after`` past its expiry (a proxy gone for good, a service nobody
asks for) is deleted by the rotation pass, under its claim and only if it is still past
expiry as stored now (another replica may have re-issued it). Pruning rings no signal, so a
standby drops the same records from memory on its own (:meth:`forget_pruned`). The CA is
never pruned.
"""

from __future__ import annotations

import datetime as dt
import logging

from trellis_certmanager.claims import Claim
from trellis_certmanager.domain.errors import NotFound, NotRevocable
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord, past_expiry
from trellis_certmanager.domain.renewal import Renewal
from trellis_certmanager.domain.revocation import Revocation, RevocationReason
from trellis_certmanager.ledger import CertificateLedger, log


class Upkeep(CertificateLedger):
    """The manager's rotate and revoke calls, and what the rotation pass calls (module
    docstring)."""

    async def rotate(
        self,
        common_name: str,
        reason: str = "on-demand",
        renewal: Renewal | None = None,
        *,
        serial: int | None = None,
        fence: int | None = None,
    ) -> CertificateRecord:
        """Re-issue now; a proxy's ``renewal`` brings its new key (domain/renewal.py). With
        ``serial``, only if that is still the current one (the rotation pass: another
        replica may have renewed it since); ``fence``: the rotation leader's token."""
        async with self._records.exclusive(common_name, fence) as claim:
            current = await self._records.stored(common_name)
            if current is None:
                raise NotFound(common_name)
            if serial is not None and current.serial != serial:
                return current  # rotated or renewed elsewhere meanwhile
            key = renewal.checked(current) if renewal is not None else None
            record = self._timed(
                current.kind, lambda: self.issuer.reissue(current, self._clock(), key)
            )
            await self._commit(record, "rotated", reason, claim)
            if current.kind == CertificateKind.PROXY:
                await self._retire(current, claim)
            log.log(
                logging.INFO if reason in ("on-demand", "renewed") else logging.DEBUG,
                "cert.rotated cn=%s kind=%s reason=%s old_serial=%x serial=%x not_after=%s",
                common_name,
                current.kind,
                reason,
                current.serial,
                record.serial,
                record.not_after.isoformat(),
            )
            return record

    async def revoke(self, common_name: str) -> Revocation:
        """Revoke a proxy certificate: its serial is refused from now on, and its record is
        deleted (the proxy is no longer expected; onboarding it again issues a new one)."""
        async with self._records.exclusive(common_name) as claim:
            current = await self._records.stored(common_name)
            if current is None:
                raise NotFound(common_name)
            if current.kind != CertificateKind.PROXY:
                raise NotRevocable(common_name)
            revocation = await self.revocations.add(
                current, RevocationReason.REVOKED, self._clock(), claim
            )
            await self._store.delete_many([common_name], claim)
            self._records.place(common_name, None)
            self._count()
            await self._signal("revoked", common_name)
            return revocation

    # -- the rotation pass's hooks -------------------------------------------------

    def records(self) -> tuple[CertificateRecord, ...]:
        """Every record held, at this moment (the rotation pass walks them)."""
        return tuple(self._records.values())

    def now(self) -> dt.datetime:
        return self._clock()

    def forget_pruned(self) -> int:
        """On a standby: drop from memory what the leader prunes (pruning rings no signal)."""
        gone = self._records.forget(past_expiry(self.records(), self._clock(), self._prune_after))
        self._count()
        return gone

    async def take_fence(self, token: int) -> None:
        """The rotation leader's pass starts: ``Deposed`` if a newer leader has started."""
        await self._store.take_fence(token)

    async def prune_expired(self, fence: int | None = None) -> int:
        """Delete the records that expired more than ``prune_after`` ago; returns how many.
        ``fence``: the rotation leader's token (its writes are fenced)."""
        pruned = 0
        grace = self._prune_after
        for name in past_expiry(self._records.values(), self._clock(), grace):
            record = await self._records.delete_if(  # not while it is re-issued
                name, lambda r: bool(past_expiry([r], self._clock(), grace)), fence
            )
            if record is not None:
                self.demand.forget(name)
                pruned += 1
                log.debug(
                    "cert.pruned cn=%s kind=%s not_after=%s", name, record.kind, record.not_after
                )
        if pruned:
            self._count()
            log.info("cert.pruned_expired count=%d grace=%s", pruned, self._prune_after)
        await self.revocations.prune(self._clock(), self._prune_after, Claim(fence=fence))
        return pruned
