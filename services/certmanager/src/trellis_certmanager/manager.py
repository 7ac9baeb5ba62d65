"""The certificate manager: the CA in force, the records, rotation, and change signals.

It owns the design's Certificate Manager contract (issue, get, rotate, root, list) on top
of the pure :mod:`trellis_certmanager.domain`, a durable
:class:`~trellis_certmanager.store.CertificateStore` and a bell (``announce``) that signals
every change on the topic ``certificates``. :class:`CertificateManager` is assembled from
parts, one module each, so that each responsibility reads on its own:

* :mod:`trellis_certmanager.ledger`: the state every part shares, and the one path by which
  a record changes (stored, held, counted, signalled), the bell and its topic;
* :mod:`trellis_certmanager.issuance`: issuing service and proxy certificates;
* :mod:`trellis_certmanager.upkeep`: rotation, revocation and pruning, and what the rotation
  pass (:mod:`trellis_certmanager.rotation`) calls;
* :mod:`trellis_certmanager.storekeeping`: keeping memory and the store in step (signals,
  resyncs, refilling a store that lost its data, records refused at load);
* this module: start-up, and the reads.

Callers import the manager and its contract (``TOPIC``, ``Announce``, ``utcnow``) from here.

Replicas: any number of certmanagers share one store, and each one issues. A change of
one common name is made under its claim, across replicas (:mod:`trellis_certmanager.claims`),
on the record stored now (:mod:`trellis_certmanager.replicas`): concurrent callers, on one
replica or several, get one certificate. Memory follows every replica's signals
(:mod:`trellis_certmanager.coherence`). Rotation and pruning run on the leader only, fenced.

Planted CA: which CA is in force, and refusing any other, is :mod:`trellis_certmanager.custody`.
Corrupt state: a CA that cannot be loaded stops certmanager with an error naming the Redis
key and the remedy (the root-fingerprint marker is left as it is, so no new root is made in
its place), unless the operator gave the CA files, which then replace it.
"""

from __future__ import annotations

from pathlib import Path

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.errors import NotFound
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.issuance import Issuance
from trellis_certmanager.ledger import ROOT_KEY, TOPIC, Announce, log, utcnow
from trellis_certmanager.storekeeping import StoreKeeping
from trellis_certmanager.upkeep import Upkeep

__all__ = ["TOPIC", "Announce", "CertificateManager", "utcnow"]


class CertificateManager(Issuance, Upkeep, StoreKeeping):
    """The Certificate Manager (module docstring); its constructor is
    :class:`~trellis_certmanager.ledger.CertificateLedger`'s."""

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

    # -- the reads -----------------------------------------------------------------

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
