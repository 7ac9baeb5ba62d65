"""The certificate manager's state, and the one path by which a record changes.

:class:`~trellis_certmanager.manager.CertificateManager` is assembled from parts, one module
each (:mod:`.issuance`, :mod:`.upkeep`, :mod:`.storekeeping`), and every part changes the
records. :class:`CertificateLedger` is what they share, so that a change is made the same
way whichever part makes it: it holds the state (the CA in force through its
:class:`~trellis_certmanager.domain.issuer.Issuer`, the records held in memory, the
revocations, the demand, the records refused at load) and the write path, which stores the
record, holds it, counts it and rings the bell, in that order.

The bell (``announce``) signals every change on the topic ``certificates`` (kinds
``issued``, ``rotated``, ``revoked``, ``root-changed``; key: the common name, ``root`` for
the root). It is the service's outbox (``docs/architecture.md``, "One event path"): a
signal Redis does not take is kept and sent later, and consumers fetch what changed with
``GetCertificateInfo`` or ``IssueCertificate``. A signal that fails is logged, never raised:
the change is already stored, and consumers resync. ``revision`` follows the bell's, and
counts on locally while a signal waits in the outbox, so a reader still sees that something
changed.

The manager's events keep the logger they have always had (``trellis_certmanager.manager``),
whichever of its modules logs them: log queries select on ``logger=``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable

from trellis_certmanager.claims import Claim
from trellis_certmanager.custody import CaCustody
from trellis_certmanager.demand import Demand
from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.errors import CAError
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.domain.revocation import RevocationReason
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.replicas import HeldRecords
from trellis_certmanager.revocations import Revocations
from trellis_certmanager.store import CertificateStore
from trellis_runtime.health import Rejections
from trellis_runtime.stored import Refused

log = logging.getLogger("trellis_certmanager.manager")

Announce = Callable[[str, str], Awaitable[int]]  # (kind, common name) -> revision, 0: kept
Clock = Callable[[], dt.datetime]

TOPIC = "certificates"
#: The key of a ``root-changed`` signal.
ROOT_KEY = "root"
REJECTION_SOURCE = "redis"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class CertificateLedger:
    """The state every part of the manager shares, and its write path (module docstring)."""

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

    # -- the write path ------------------------------------------------------------

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
