"""The rotation pass, every ``rotation_interval``: what is due is rotated, then what
expired long ago is pruned (:meth:`~trellis_certmanager.manager.CertificateManager.prune_expired`).

- A service certificate is re-issued once ``renew_fraction`` of its lifetime has passed, if
  someone asked for it since it was issued (else it is left to expire, then pruned), and
  at once when the CA in force did not sign it (the operator changed CAs).
- A proxy certificate's key is on the proxy's host: its host renews it (``trellis proxy
  renew``, the pod agent); the pass only warns, once per serial, when one passes its renewal
  point unrenewed. One the CA in force did not sign is re-signed for the same key.

A pass that meets a Redis outage stops until the next one; any other failure of one record
is logged and the others go on; a failed pass never ends the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging

from trellis_certmanager.domain.errors import StoreUnavailable
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.manager import CertificateManager

log = logging.getLogger(__name__)


async def run(manager: CertificateManager, stop: asyncio.Event, interval: float = 5.0) -> None:
    """Rotate what is due every ``interval`` seconds until ``stop``."""
    warned: set[tuple[str, int]] = set()
    while not stop.is_set():
        try:
            rotated = await rotate_due(manager, warned)
            if rotated:
                log.info("cert.rotation_pass rotated=%d", rotated)
            await manager.prune_expired()
        except Exception:  # a bad pass must not end rotation for good
            log.exception("cert.rotation_pass_failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)


async def rotate_due(
    manager: CertificateManager, warned: set[tuple[str, int]] | None = None
) -> int:
    """One pass of the rotation loop; returns how many certificates it rotated."""
    now = manager.now()
    rotated = 0
    for record in manager.records():
        try:
            rotated += await _rotate_if_due(manager, record, now, warned)
        except StoreUnavailable as exc:  # the next record would fail the same way
            log.warning("cert.rotation_deferred reason=%r", str(exc))
            break
        except Exception:  # one failure must not stop the others
            log.exception("cert.rotation_failed cn=%s", record.common_name)
    return rotated


async def _rotate_if_due(
    manager: CertificateManager,
    record: CertificateRecord,
    now: dt.datetime,
    warned: set[tuple[str, int]] | None,
) -> int:
    stale_ca = not manager.ca.signed(record.cert_chain_pem)
    if record.kind == CertificateKind.PROXY and not stale_ca:
        seen = (record.common_name, record.serial)
        if record.due(now) and warned is not None and seen not in warned:
            warned.add(seen)
            log.warning(
                "cert.proxy_renewal_due cn=%s not_after=%s action='trellis proxy renew'",
                record.common_name,
                record.not_after.isoformat(),
            )
        return 0
    if not stale_ca and record.due(now) and not manager.still_wanted(record):
        return 0  # nobody asked for it since it was issued: it expires, then is pruned
    if stale_ca or record.due(now):
        await manager.rotate(record.common_name, "ca-changed" if stale_ca else "expiring")
        return 1
    return 0
