"""The control plane's own certificates: which were issued, and which an operator revoked.

Component certificates live 24 h and renew themselves, but a key that leaked must not
stay good for a day: ``trellis identity revoke <component>`` (``POST
/v1/identities/{component}/revoke``) revokes every unexpired certificate certmanager issued
to that component. Each component follows the revoked list (``ListRevokedComponentCertificates``,
signal ``identities``/``revoked``) and its authorizer refuses a call made with a revoked
serial (reason ``revoked``); the component whose certificate it is finds its own serial in
the list and exits, so its supervisor starts it again with a new join token and a new key.

"Issued to" means every certificate certmanager made that names a component (its DNS names,
its SPIFFE id, its common name): the component's joins and renewals, which are the only ones
it makes now (no service, proxy or workload certificate is issued in the control plane's
namespace), and, adopted at start (:meth:`ComponentCertificates.adopt`), the service
certificates of that namespace an earlier version issued (proxy-cp's serving certificate),
which may name two components (one by its service, one by its account).

Both lists are kept in Redis (``trellis:certmanager:identities:issued`` and
``...:revoked``, serial -> JSON; no key material, only who, which serial, until when), so a
restarted certmanager still knows what it issued, and an entry is dropped once its
certificate has expired (the TLS handshake refuses it then anyway). With several
certmanager replicas, each one reads both lists again before it revokes, and on every
``identities`` signal (:mod:`trellis_certmanager.coherence`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from trellis_certmanager.domain.errors import StoreUnavailable
from trellis_runtime import redisconn

log = logging.getLogger(__name__)

ISSUED_KEY = "trellis:certmanager:identities:issued"
REVOKED_KEY = "trellis:certmanager:identities:revoked"


@dataclass(frozen=True)
class ComponentCert:
    component: str
    serial: str  # lowercase hex
    not_after: float  # epoch seconds
    issued_at: float
    revoked_at: float = 0.0
    #: other components the certificate names (an adopted service certificate's)
    also: tuple[str, ...] = ()

    def names(self, component: str) -> bool:
        return component == self.component or component in self.also


def _load(raw: dict[bytes | str, bytes | str]) -> dict[str, ComponentCert]:
    found = {}
    for serial, body in raw.items():
        try:
            key = serial.decode() if isinstance(serial, bytes) else serial
            fields = json.loads(body)
            fields["also"] = tuple(fields.get("also", ()))
            found[key] = ComponentCert(**fields)
        except (ValueError, TypeError, AttributeError) as exc:  # one bad entry is skipped
            log.warning("identities.entry_refused serial=%r error=%r", serial, str(exc))
    return found


class ComponentCertificates:
    def __init__(
        self,
        redis: aioredis.Redis,
        clock: Callable[[], dt.datetime],
        *,
        min_replicas_ack: int = 0,
    ) -> None:
        self._redis = redis
        self._clock = clock
        self._min_replicas_ack = min_replicas_ack  # a revocation is on a replica (WAIT)
        self.issued: dict[str, ComponentCert] = {}
        self.revoked: dict[str, ComponentCert] = {}

    async def load(self) -> None:
        """Read both lists (at start, before a revocation, on a signal): what is stored, and
        what is held here and unexpired (written a moment ago, or lost by a wiped Redis)."""
        try:
            self.issued = self._merged(self.issued, await self._redis.hgetall(ISSUED_KEY))
            self.revoked = self._merged(self.revoked, await self._redis.hgetall(REVOKED_KEY))
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"cannot read the component certificates: {exc}") from exc
        await self.prune()

    def _merged(
        self, held: dict[str, ComponentCert], raw: dict[bytes | str, bytes | str]
    ) -> dict[str, ComponentCert]:
        now = self._clock().timestamp()
        return {**{k: c for k, c in held.items() if c.not_after >= now}, **_load(raw)}

    def is_revoked(self, serial: str) -> bool:
        return serial in self.revoked

    async def current_revoked(self) -> list[ComponentCert]:
        """The revoked list as stored now (another replica may have revoked some: its
        signal may reach the caller first); the one held while Redis is away."""
        try:
            self.revoked = self._merged(self.revoked, await self._redis.hgetall(REVOKED_KEY))
        except (RedisError, OSError) as exc:
            log.debug("identities.revoked_from_memory error=%r", str(exc))
        return list(self.revoked.values())

    async def issued_now(self, component: str, serial: int, not_after: dt.datetime) -> None:
        cert = ComponentCert(
            component, f"{serial:x}", not_after.timestamp(), self._clock().timestamp()
        )
        self.issued[cert.serial] = cert
        try:
            await self._redis.hset(ISSUED_KEY, cert.serial, json.dumps(asdict(cert)))
        except (RedisError, OSError) as exc:  # revocable while this process runs
            log.warning("identities.not_recorded serial=%s error=%r", cert.serial, str(exc))

    async def adopt(
        self, named: tuple[str, ...], serial: int, issued_at: dt.datetime, not_after: dt.datetime
    ) -> ComponentCert:
        """Record a certificate an earlier version issued that names the components
        ``named`` (the first is the one it is listed under), durably: StoreUnavailable if
        Redis did not take it (the caller then keeps what it was about to delete)."""
        cert = ComponentCert(
            named[0], f"{serial:x}", not_after.timestamp(), issued_at.timestamp(), also=named[1:]
        )
        try:
            await self._redis.hset(ISSUED_KEY, cert.serial, json.dumps(asdict(cert)))
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"cannot record certificate {cert.serial}: {exc}") from exc
        self.issued[cert.serial] = cert
        log.warning(
            "identities.adopted serial=%s components=%s not_after=%s",
            cert.serial,
            ",".join(named),
            not_after.isoformat(),
        )
        return cert

    async def revoke(self, component: str) -> list[ComponentCert]:
        """Revoke every unexpired certificate that names ``component``; the newly revoked.
        Both lists are read again first: another replica may have issued or revoked some."""
        await self.load()
        now = self._clock().timestamp()
        fresh = [
            replace(c, revoked_at=now)
            for c in self.issued.values()
            if c.names(component) and c.serial not in self.revoked
        ]
        if not fresh:
            return []
        try:
            await self._redis.hset(
                REVOKED_KEY, mapping={c.serial: json.dumps(asdict(c)) for c in fresh}
            )
            await redisconn.replicated(self._redis, replicas=self._min_replicas_ack)
        except (RedisError, OSError) as exc:  # NotReplicated too: retried, not acknowledged
            raise StoreUnavailable(f"cannot record the revocation: {exc}") from exc
        for cert in fresh:
            self.revoked[cert.serial] = cert
            log.warning(
                "identity.revoked component=%s serial=%s not_after=%s",
                component,
                cert.serial,
                dt.datetime.fromtimestamp(cert.not_after, dt.UTC).isoformat(),
            )
        return fresh

    async def prune(self) -> None:
        """Forget certificates that have expired (both lists)."""
        now = self._clock().timestamp()
        for key, entries in ((ISSUED_KEY, self.issued), (REVOKED_KEY, self.revoked)):
            gone = [serial for serial, cert in entries.items() if cert.not_after < now]
            if not gone:
                continue
            for serial in gone:
                del entries[serial]
            try:
                await self._redis.hdel(key, *gone)
            except (RedisError, OSError) as exc:  # the next prune tries again
                log.warning("identities.prune_failed error=%r", str(exc))
