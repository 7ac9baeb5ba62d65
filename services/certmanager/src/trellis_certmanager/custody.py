"""Which CA is in force, and refusing any other: the CA part of certmanager's start and guard.

At start the CA comes from the operator's files (they replace the stored one), from the
store, or is created once (``SET NX``, so replicas agree). The root-fingerprint marker
(``<state-dir>/certmanager/root-fingerprint``) pins the mesh's root:

* a stored CA whose root is not the marker's is :class:`PlantedCA`: someone wrote another
  CA into Redis. It is refused, loudly, never adopted;
* an empty store while the marker exists means the store lost its data: certmanager
  refuses to make a new root in its place.

While running, the store guard hands every CA it finds to :meth:`CaCustody.check_ours`: one
that is not the CA in force is refused the same way. Each refusal is counted in
``trellis_certmanager_ca_refused_total{reason}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from trellis_certmanager.domain.authority import CertificateAuthority, generate_root
from trellis_certmanager.domain.errors import CAError, PlantedCA
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.store import CertificateStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Chosen:
    ca: CertificateAuthority
    root_changed: bool  # the operator's CA replaced the one on record


class CaCustody:
    def __init__(
        self,
        store: CertificateStore,
        metrics: CertMetrics,
        algorithm: KeyAlgorithm,
        root_validity: dt.timedelta,
        trust_domain: str,
        clock: Callable[[], dt.datetime],
    ) -> None:
        self._store = store
        self._metrics = metrics
        self._algorithm = algorithm
        self._root_validity = root_validity
        self._trust_domain = trust_domain
        self._clock = clock
        #: held while the store is restored; :meth:`CertificateManager.reload` waits for it
        self.restoring = asyncio.Lock()

    async def choose(self, provided: CertificateAuthority | None, marker: Path | None) -> Chosen:
        """The CA this certmanager serves (see the module docstring); writes the marker."""
        root_changed = False
        try:
            stored = await self._store.load_ca()
        except CAError as exc:
            if provided is None:
                raise
            log.error("ca.unreadable error=%r action=replacing-with-operator-ca", str(exc))
            stored, root_changed = None, True
        if provided is not None:
            if stored is None or (stored.fingerprint, stored.cert) != (
                provided.fingerprint,
                provided.cert,
            ):
                await self._store.replace_ca(provided)
                if stored is not None:
                    log.warning(
                        "ca.replaced_by_operator_ca previous=%s new=%s",
                        stored.fingerprint,
                        provided.fingerprint,
                    )
                    root_changed = True
            ca = provided
        elif stored is not None:
            self._refuse_if_planted(stored, marker)
            ca = stored
            await self._store.seal_ca(ca)  # ours: one an older version kept in the clear
        else:
            ca = await self._create(marker)
        if marker is not None:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(ca.fingerprint + "\n")
        return Chosen(ca, root_changed)

    async def _create(self, marker: Path | None) -> CertificateAuthority:
        if marker is not None and marker.exists():
            raise CAError(
                f"the CA store is empty but this mesh's root is "
                f"{marker.read_text().strip()} ({marker}); restore the store's data, or "
                f"delete {marker} to create a new root on purpose"
            )
        ca = await self._store.save_ca_if_absent(
            generate_root(self._algorithm, self._root_validity, self._clock(), self._trust_domain)
        )
        log.info("ca.created fingerprint=%s algorithm=%s", ca.fingerprint, self._algorithm)
        return ca

    def _refuse_if_planted(self, stored: CertificateAuthority, marker: Path | None) -> None:
        """At start: a stored CA whose root is not the one in the fingerprint marker."""
        if marker is None or not marker.exists():
            return  # first start, or a state directory lost: the stored CA is all we know
        expected = marker.read_text().strip()
        if expected and stored.fingerprint != expected:
            self._metrics.ca_refused.labels("planted").inc()
            raise PlantedCA(
                f"the CA in the store has root {stored.fingerprint} but this mesh's root is "
                f"{expected} ({marker}): someone wrote another CA into Redis. It is refused, "
                f"never adopted. Restore the CA key from a backup of Redis; to change the mesh "
                f"root on purpose, start certmanager with the CA files "
                f"(--ca-cert-file/--ca-key-file), or delete {marker}"
            )

    def check_ours(
        self, stored: CertificateAuthority, current: CertificateAuthority, path: str
    ) -> None:
        """While running: :class:`PlantedCA` if ``stored`` is not the CA in force."""
        if stored.fingerprint == current.fingerprint and stored.cert == current.cert:
            return
        self._metrics.ca_refused.labels("planted").inc()
        raise PlantedCA(
            f"the CA in the store (root {stored.fingerprint}) is not the one this "
            f"certmanager serves (root {current.fingerprint}), found by the {path}: someone "
            f"wrote another CA into Redis. It is refused, never adopted. Restore the CA key "
            f"from a backup of Redis and find who can write to it; to change the mesh root "
            f"on purpose, start certmanager with the CA files (--ca-cert-file/--ca-key-file)"
        )

    async def guard(
        self,
        stop: asyncio.Event,
        interval: float,
        current: Callable[[], CertificateAuthority],
        refill: Callable[[], Awaitable[None]],
    ) -> None:
        """Every ``interval``: :meth:`restore_if_lost`. A CA that is not ours, or none that
        can be read, ends the guard (and certmanager); Redis being away is retried."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval)
                return
            try:
                await self.restore_if_lost(current(), refill)
            except CAError as exc:  # not our CA, or none we can read: never adopted
                if not isinstance(exc, PlantedCA):
                    self._metrics.ca_refused.labels("unreadable").inc()
                raise
            except Exception as exc:  # noqa: BLE001 (the store being down is retried next round)
                log.warning("ca.guard_failed error=%r", exc)

    async def restore_if_lost(
        self, current: CertificateAuthority, refill: Callable[[], Awaitable[None]]
    ) -> bool:
        """Put the CA back (then ``refill`` the rest) if the store lost it; True if it did.
        Under :attr:`restoring`: a reload waits for it, and never reads a half-refilled
        store (the CA back, the records not yet) as the truth."""
        async with self.restoring:
            return await self._restore_if_lost(current, refill)

    async def _restore_if_lost(
        self, current: CertificateAuthority, refill: Callable[[], Awaitable[None]]
    ) -> bool:
        stored = await self._store.load_ca()
        if stored is not None:
            self.check_ours(stored, current, "store guard")
            return False
        log.warning("ca.store_lost action=restoring fingerprint=%s", current.fingerprint)
        # Another writer may have put a CA there since we looked: it wins the SET NX, and
        # is refused here rather than served over.
        self.check_ours(await self._store.save_ca_if_absent(current), current, "refill")
        await refill()
        return True
