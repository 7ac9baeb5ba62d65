"""The certificate manager: the CA in force, the records, rotation, and change signals.

It owns the design's Certificate Manager contract (issue, get, rotate, root, list) on top
of the pure :mod:`trellis_certmanager.domain`, a durable
:class:`~trellis_certmanager.store.CertificateStore` and a bell (``announce``) that signals
every change on the topic ``certificates`` (kinds ``issued``, ``rotated``, ``revoked``,
``root-changed``; key: the common name, ``root`` for the root). The bell is the service's outbox
(``docs/architecture.md``, "One event path"): a signal Redis does not take is kept and sent
later, and consumers fetch what changed with ``GetCertificateInfo`` or ``IssueCertificate``.

Replicas: any number of certmanagers share one store, and each one issues. A change of
one common name is made under its claim, across replicas (:mod:`trellis_certmanager.claims`),
on the record stored now (:mod:`trellis_certmanager.replicas`): concurrent callers, on one
replica or several, get one certificate. Memory follows every replica's signals
(:mod:`trellis_certmanager.coherence`). Rotation and pruning run on the leader only, fenced.

Rotation: what is due, by the periodic pass (:mod:`trellis_certmanager.rotation`), which
also prunes. Proxy certificates are issued for a CSR (certmanager never has the key): the
proxy renews its own through proxy-cp (:meth:`rotate` with a ``renewal``), and an
operator's rotation re-signs the same key.

No service certificate is issued in the control plane's namespace (ControlPlaneNamespace,
logged and counted in ``issue_refused``): its names are the components', whose own
certificates are what they serve; main adopts and drops any an earlier version made.

Revocation (:mod:`trellis_certmanager.revocations`): revoking a proxy certificate records its
serial as revoked and deletes the record (the proxy is no longer expected); rotating one
revokes the old serial. Both signal ``revoked`` (key: the common name), on which proxy-cp
closes the streams opened with a revoked serial.

Pruning: a record ``prune_after`` past its expiry (a proxy gone for good, a service nobody
asks for) is deleted by the rotation pass. The CA is never pruned.

Redis outages: reads (get, list, an issue request the current certificate satisfies) come
from memory; a write Redis does not take fails with
:class:`~trellis_certmanager.domain.errors.StoreUnavailable` and changes nothing, and a
rotation pass that meets one stops until the next pass.

Planted CA: which CA is in force, and refusing any other, is :mod:`trellis_certmanager.custody`.
Corrupt state: a CA that cannot be loaded stops certmanager with an error naming the Redis
key and the remedy (the root-fingerprint marker is left as it is, so no new root is made in
its place), unless the operator gave the CA files, which then replace it. Records refused
at load are reported through ``rejections`` (source ``redis``) and never served; re-issuing
the same common name overwrites one, and :meth:`CertificateManager.delete_rejected` removes
one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from trellis_certmanager.claims import Claim
from trellis_certmanager.custody import CaCustody
from trellis_certmanager.demand import Demand
from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.csr import PublicKey, signed_for
from trellis_certmanager.domain.errors import (
    CAError,
    ControlPlaneNamespace,
    InvalidRequest,
    NotFound,
    NotRevocable,
)
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord, past_expiry
from trellis_certmanager.domain.renewal import Renewal
from trellis_certmanager.domain.revocation import Revocation, RevocationReason
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.replicas import HeldRecords
from trellis_certmanager.revocations import Revocations
from trellis_certmanager.store import CertificateStore
from trellis_common.ids import InvalidIdentifier, ProxyCommonName, ProxyId
from trellis_common.model import MeshService
from trellis_runtime.health import Rejections
from trellis_runtime.stored import Refused

log = logging.getLogger(__name__)

Announce = Callable[[str, str], Awaitable[int]]  # (kind, common name) -> revision, 0: kept
Clock = Callable[[], dt.datetime]

TOPIC = "certificates"
#: The key of a ``root-changed`` signal.
ROOT_KEY = "root"
REJECTION_SOURCE = "redis"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertificateManager:
    def __init__(
        self,
        store: CertificateStore,
        announce: Announce,
        policy: IssuancePolicy,
        algorithm: KeyAlgorithm,
        metrics: CertMetrics,
        clock: Clock = utcnow,
        root_validity: dt.timedelta = dt.timedelta(days=3650),
        *,
        rejections: Rejections | None = None,
        prune_after: dt.timedelta = dt.timedelta(days=1),
    ) -> None:
        self._store = store
        self._rejected = Refused(rejections, REJECTION_SOURCE)  # by common name
        self._prune_after = prune_after
        self._announce = announce
        self._policy = policy
        self._algorithm = algorithm
        self._metrics = metrics
        self._clock = clock
        self._custody = CaCustody(
            store, metrics, algorithm, root_validity, policy.trust_domain, clock
        )
        self._records = HeldRecords(store, self._rejected)
        self.demand = Demand(store, clock)  # which service certificates are asked for
        self._issuer: Issuer | None = None
        self.revocations = Revocations(store, metrics, rejections, clock=clock, grace=prune_after)
        self.revision = 0
        self.ready = asyncio.Event()

    # -- start-up ------------------------------------------------------------------

    async def start(
        self, provided: CertificateAuthority | None = None, marker: Path | None = None
    ) -> CertificateAuthority:
        """Load or create the CA, then load the records and queue stale ones for rotation.

        ``marker`` is a file holding the root fingerprint of this mesh: with it present and
        the store empty, certmanager refuses to make a new root (the store lost its data).
        """
        chosen = await self._custody.choose(provided, marker)
        ca, root_changed = chosen.ca, chosen.root_changed
        self._install(ca)
        if root_changed:  # consumers running across the restart take the new trust bundle
            await self._signal("root-changed", ROOT_KEY)
        loaded = await self._records.reload()
        revoked = await self.revocations.load()
        self._count()
        log.info(
            "ca.ready origin=%s fingerprint=%s records=%d rejected=%d revoked=%d",
            ca.origin,
            ca.fingerprint,
            len(self._records),
            len(loaded.rejected),
            revoked,
        )
        self.ready.set()
        return ca

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

    def _install(self, ca: CertificateAuthority) -> None:
        self._issuer = Issuer(ca, self._algorithm, self._policy)
        self._metrics.root_not_after.set(ca.roots[0].not_valid_after_utc.timestamp())

    @property
    def issuer(self) -> Issuer:
        if self._issuer is None:
            raise CAError("certmanager has not loaded its CA yet")
        return self._issuer

    @property
    def ca(self) -> CertificateAuthority:
        return self.issuer.ca

    # -- the API -------------------------------------------------------------------

    async def issue_service(
        self,
        service: MeshService,
        service_account: str = "",
        validity: dt.timedelta | None = None,
        *,
        requester: str = "-",
    ) -> CertificateRecord:
        """A service certificate (the current one while it is good); none in the control
        plane's namespace (logged with ``requester``, counted, ControlPlaneNamespace)."""
        if self._policy.reserved(service.namespace):
            refused = ControlPlaneNamespace(service.namespace, service.name)
            self._metrics.issue_refused.labels("service", refused.reason).inc()
            log.warning(
                "cert.refused kind=service reason=%s service=%s requester=%s",
                refused.reason,
                service,
                requester,
            )
            raise refused
        account = service_account or service.name
        cn = self.issuer.service_common_name(service)
        self.demand.asked(cn)

        def fits(current: CertificateRecord) -> bool:
            return (
                self._policy.lifetime_fits(current.lifetime, validity)
                and current.service_account == account
                and not current.due(self._clock())
                and self.ca.signed(current.cert_chain_pem)
            )

        async def issue(current: CertificateRecord | None, claim: Claim) -> CertificateRecord:
            record = self._timed(
                CertificateKind.SERVICE,
                lambda: self.issuer.issue_service(service, account, self._clock(), validity),
            )
            change = "issued" if current is None else "rotated"
            await self._commit(record, change, "reissue", claim)
            return record

        return await self._records.current_or(cn, fits, issue)

    async def issue_proxy(
        self,
        service: MeshService,
        proxy_id: str = "",
        service_account: str = "",
        validity: dt.timedelta | None = None,
        *,
        public_key: PublicKey,
    ) -> CertificateRecord:
        """A proxy certificate for ``public_key`` (the proxy's CSR). The current one of the
        same proxy is returned if it is valid and for the same key; for another key a new
        one is issued and the old serial revoked (reason ``rotated``): one key per proxy."""
        try:
            cn = (
                ProxyCommonName(ProxyId(proxy_id), service.name, service.namespace)
                if proxy_id
                else ProxyCommonName.new(service.name, service.namespace)
            )
        except InvalidIdentifier as exc:
            raise InvalidRequest(exc.field.replace(" ", "_"), str(exc)) from exc

        def fits(live: CertificateRecord) -> bool:
            return (
                live.not_after > self._clock()
                and validity is None
                and signed_for(live.cert_chain_pem, public_key)
            )

        async def issue(live: CertificateRecord | None, claim: Claim) -> CertificateRecord:
            account = service_account or service.name
            record = self._timed(
                CertificateKind.PROXY,
                lambda: self.issuer.issue_proxy(
                    cn, account, self._clock(), validity, public_key=public_key
                ),
            )
            await self._commit(record, "issued", "reissue", claim)
            if live is not None and live.not_after > self._clock():  # expired: not revoked
                await self._retire(live, claim)
            return record

        return await self._records.current_or(cn.format(), fits, issue)

    def workload_chain(self, proxy: CertificateRecord) -> bytes:
        """``proxy``'s own workload certificate (PEM chain), signed now (Issuer)."""
        return self.issuer.workload_chain(proxy, self._clock())

    def get(self, common_name: str) -> CertificateRecord:
        """The record of ``common_name`` (a service certificate asked for is still wanted)."""
        record = self.peek(common_name)
        if record.kind == CertificateKind.SERVICE:
            self.demand.asked(common_name)
        return record

    def peek(self, common_name: str) -> CertificateRecord:
        """The record of ``common_name``, for its metadata: unlike :meth:`get`, reading it
        does not keep a service certificate wanted (a consumer looking at what a signal
        named is not using the certificate)."""
        record = self._records.get(common_name)
        if record is None:
            raise NotFound(common_name)
        return record

    async def lookup(self, common_name: str, *, wanted: bool = False) -> CertificateRecord:
        """:meth:`peek` (:meth:`get` if ``wanted``) of the record stored now: another replica
        may have changed it, and its signal may reach the caller before it reaches us."""
        await self._records.lookup(common_name)
        return self.get(common_name) if wanted else self.peek(common_name)

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

    def list(
        self, kind: CertificateKind | None = None, namespace: str = ""
    ) -> list[CertificateRecord]:
        return sorted(
            (
                r
                for r in self._records.values()
                if (kind is None or r.kind == kind) and (not namespace or r.namespace == namespace)
            ),
            key=lambda r: r.common_name,
        )

    # -- background work -----------------------------------------------------------

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

    # -- helpers -------------------------------------------------------------------

    async def _retire(self, replaced: CertificateRecord, claim: Claim) -> None:
        """A proxy certificate replaced by a newer one may not connect any more."""
        await self.revocations.add(replaced, RevocationReason.ROTATED, self._clock(), claim)
        await self._signal("revoked", replaced.common_name)

    def _timed(
        self, kind: CertificateKind, make: Callable[[], CertificateRecord]
    ) -> CertificateRecord:
        started = time.perf_counter()
        record = make()
        self._metrics.issue_seconds.labels(kind.value).observe(time.perf_counter() - started)
        return record

    async def _commit(
        self, record: CertificateRecord, change: str, reason: str, claim: Claim
    ) -> None:
        await self._store.put(record, claim)
        self._rejected.overwritten(record.common_name)
        self._records.place(record.common_name, record)
        self._metrics.issued.labels(record.kind.value).inc()
        if change == "rotated":
            self._metrics.rotations.labels(record.kind.value, reason).inc()
        else:
            log.debug(
                "cert.issued cn=%s kind=%s serial=%x not_after=%s",
                record.common_name,
                record.kind,
                record.serial,
                record.not_after.isoformat(),
            )
        self._count()
        await self._signal(change, record.common_name)

    async def _signal(self, change: str, key: str) -> None:
        """Ring the bell; ``revision`` counts on locally while a signal waits in the outbox."""
        try:
            revision = await self._announce(change, key)
        except Exception as exc:  # noqa: BLE001 (the bus is a bell: consumers resync later)
            log.warning("cert.announce_failed key=%s kind=%s error=%r", key, change, exc)
            revision = 0
        self.revision = revision if revision else self.revision + 1

    def _count(self) -> None:
        for kind in CertificateKind:
            self._metrics.certificates.labels(kind.value).set(
                sum(1 for r in self._records.values() if r.kind == kind)
            )
