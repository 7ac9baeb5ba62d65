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

With several replicas, the pass runs on the leader only (``leadership``: the shape of
``trellis_kube.leadership.Leadership``: ``leading``, and a fencing ``token`` that grows
with every acquisition). Each pass first takes the rotation fence with its token, and
every write it makes is fenced (:mod:`trellis_certmanager.claims`): a leader deposed while
paused has its late writes refused (``cert.rotation_deposed``) and stops the pass. A
replica that becomes leader reads every record again before its first pass, then rotates
what is due, whoever issued it; a record rotated meanwhile by another replica (a proxy's
renewal) is left as it is. Whether a service certificate is still asked for is what every
replica was asked (:mod:`trellis_certmanager.demand`: each shares its asks every interval,
the leader reads them before each pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from typing import Protocol

from trellis_certmanager.domain.errors import Deposed, NotFound, StoreUnavailable
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.manager import CertificateManager

log = logging.getLogger(__name__)


class Leadership(Protocol):
    """What the pass needs of ``trellis_kube.leadership.Leadership``."""

    @property
    def leading(self) -> bool: ...

    @property
    def token(self) -> int: ...


async def run(
    manager: CertificateManager,
    stop: asyncio.Event,
    interval: float = 5.0,
    leadership: Leadership | None = None,
) -> int:
    """Rotate what is due every ``interval`` seconds until ``stop``, while ``leadership``
    leads (if given: a lone certmanager always does); returns the passes it made."""
    warned: set[tuple[str, int]] = set()
    runs, passes = False, 0  # whether this replica runs the passes now
    while not stop.is_set():
        leading = leadership is None or leadership.leading
        try:
            if leading and not runs and leadership is not None:
                await manager.reload()  # what the previous leader rotated, pruned
                log.info("cert.rotation_leading token=%d", leadership.token)
            elif runs and not leading:
                log.info("cert.rotation_standby")
            runs = leading
            if leadership is not None:  # the leader decides on every replica's asks
                await manager.demand.share()
            if leading:
                await one_pass(manager, warned, leadership.token if leadership else None)
                passes += 1
            else:
                manager.forget_pruned()  # as the leader prunes them from the store
        except Deposed as exc:
            log.warning("cert.rotation_pass_deposed reason=%r", str(exc))
        except StoreUnavailable as exc:  # Redis is away: the next pass tries again
            log.warning("cert.rotation_pass_deferred reason=%r", str(exc))
        except Exception:  # a bad pass must not end rotation for good
            log.exception("cert.rotation_pass_failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval)
    return passes


async def one_pass(
    manager: CertificateManager, warned: set[tuple[str, int]], fence: int | None = None
) -> None:
    """Rotate what is due, then prune; ``fence``: the leader's token (Deposed if stale)."""
    if fence is not None:
        await manager.take_fence(fence)
        await manager.demand.learn()  # what the standbys were asked for
    rotated = await rotate_due(manager, warned, fence)
    if rotated:
        log.info("cert.rotation_pass rotated=%d", rotated)
    await manager.prune_expired(fence)


async def rotate_due(
    manager: CertificateManager,
    warned: set[tuple[str, int]] | None = None,
    fence: int | None = None,
) -> int:
    """One pass of the rotation loop; returns how many certificates it rotated."""
    now = manager.now()
    rotated = 0
    for record in manager.records():
        try:
            rotated += await _rotate_if_due(manager, record, now, warned, fence)
        except Deposed:  # a newer leader rotates from now on
            raise
        except NotFound:  # revoked or pruned by another replica meanwhile
            continue
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
    fence: int | None,
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
    if not stale_ca and record.due(now) and not manager.demand.still_wanted(record):
        return 0  # nobody asked for it since it was issued: it expires, then is pruned
    if stale_ca or record.due(now):
        reason = "ca-changed" if stale_ca else "expiring"
        rotated = await manager.rotate(
            record.common_name, reason, serial=record.serial, fence=fence
        )
        return 1 if rotated.serial != record.serial else 0
    return 0
