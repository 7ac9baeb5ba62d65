"""The control plane's own identities: the join exchange and renewals.

A component joins with a token and a CSR (``POST /v1/join``, :meth:`ComponentIssuer.join`)
and renews over mTLS with its current certificate and a new CSR
(``RenewComponentCertificate``, :meth:`ComponentIssuer.renew`). Either way it gets the
certificate of ``spiffe://<td>/ns/trellis-system/sa/<component>``, for
``component_cert_validity``; its key never leaves it.

A join token (:mod:`trellis_identity.jointoken`) must verify under the join key, name a
component, be unexpired, and not be spent: its nonce is written to Redis with ``SET NX``
until the token expires, so a second use (or a replay by someone who saw it) is refused,
on whichever certmanager replica it comes; with ``min_replicas_ack`` the mark is on that
many Redis replicas before the certificate is signed, so a failover does not forget it.
A Kubernetes ServiceAccount token is checked by the API server instead
(:mod:`trellis_certmanager.tokenreview`) when certmanager has Kubernetes access (in a pod,
or with ``kubeconfig``), and is spent the same way; without it, such a token is refused
with the reason ``service_account_token``.

Every refusal is logged (``join.refused reason=...``) and counted
(``trellis_certmanager_join_refused_total{reason}``); the token itself is never logged.
certmanager's own certificate is signed in-process (:meth:`ComponentIssuer.own`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from collections.abc import Callable

import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry, Counter
from redis.exceptions import RedisError

from trellis_certmanager.componentcerts import ComponentCertificates
from trellis_certmanager.domain.csr import public_key_from_csr
from trellis_certmanager.domain.errors import InvalidRequest, StoreUnavailable
from trellis_certmanager.domain.issuer import Issuer
from trellis_certmanager.tokenreview import (
    ReviewRefused,
    ServiceAccountReviewer,
    spent_key_and_expiry,
)
from trellis_identity import jointoken
from trellis_identity.identity import Issued
from trellis_runtime import redisconn

log = logging.getLogger(__name__)

SPENT_KEY = "trellis:certmanager:join-spent:{nonce}"


class JoinRefused(Exception):
    """The token does not let anyone join; ``reason`` is the counted label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ComponentIssuer:
    def __init__(
        self,
        issuer: Callable[[], Issuer],
        redis: aioredis.Redis,
        join_key: bytes,
        validity: dt.timedelta,
        registry: CollectorRegistry,
        clock: Callable[[], dt.datetime],
        reviewer: ServiceAccountReviewer | None = None,
        certs: ComponentCertificates | None = None,
        *,
        min_replicas_ack: int = 0,
    ) -> None:
        self._issuer = issuer
        self._reviewer = reviewer
        #: what was issued to whom, and what an operator revoked (componentcerts.py)
        self.certs = certs
        self.last_issued: tuple[str, int, dt.datetime] | None = None
        self._redis = redis
        self._min_replicas_ack = min_replicas_ack  # a spent token is on a replica (WAIT)
        self._join_key = join_key
        self._validity = validity
        self._clock = clock
        self.issued = Counter(
            "trellis_certmanager_component_certificates_issued",
            "Certificates issued to control plane components, by component and how "
            "(join, renew, self)",
            ["component", "via"],
            registry=registry,
        )
        self.refused = Counter(
            "trellis_certmanager_join_refused",
            "Join requests refused, by reason",
            ["reason"],
            registry=registry,
        )

    def sign(self, component: str, csr_pem: bytes, via: str) -> Issued:
        issuer = self._issuer()
        public_key = public_key_from_csr(csr_pem)
        cert = issuer.issue_component(component, public_key, self._clock(), self._validity)
        self.issued.labels(component, via).inc()
        log.info(
            "identity.issued component=%s via=%s serial=%x not_after=%s",
            component,
            via,
            cert.serial_number,
            cert.not_valid_after_utc.isoformat(),
        )
        self.last_issued = (component, cert.serial_number, cert.not_valid_after_utc)
        return Issued(issuer.chain_pem(cert), issuer.ca.trust_bundle_pem)

    async def _recorded(self, issued: Issued) -> Issued:
        """Remember the certificate just signed, so it can be revoked."""
        if self.certs is not None and self.last_issued is not None:
            await self.certs.issued_now(*self.last_issued)
        return issued

    def own(self, csr_pem: bytes) -> Issued:
        return self.sign("certmanager", csr_pem, "self")

    async def join(self, token: str, csr_pem: bytes, peer: str) -> Issued:
        """Trade a join token and a CSR for a component certificate (see the module)."""
        try:
            component = await self._admit(token)
            if component == "certmanager":
                raise JoinRefused("not_joinable", "certmanager signs its own certificate")
            return await self._recorded(self.sign(component, csr_pem, "join"))
        except (JoinRefused, InvalidRequest) as exc:
            reason = exc.reason if isinstance(exc, JoinRefused) else "bad_csr"
            self.refused.labels(reason).inc()
            log.warning("join.refused reason=%s peer=%s error=%r", reason, peer, str(exc))
            raise

    async def renew(self, component: str, csr_pem: bytes) -> Issued:
        return await self._recorded(self.sign(component, csr_pem, "renew"))

    async def _admit(self, token: str) -> str:
        if not jointoken.is_join_token(token):
            return await self._admit_service_account(token)
        now = self._clock().timestamp()
        try:
            claim = jointoken.verify(self._join_key, token, now)
        except jointoken.InvalidJoinToken as exc:
            reason = "expired" if str(exc) == "expired" else "invalid_token"
            raise JoinRefused(reason, f"join token refused: {exc}") from None
        await self._spend(claim.nonce, claim.component, claim.expires_at + 60)
        return claim.component

    async def _admit_service_account(self, token: str) -> str:
        if self._reviewer is None:
            raise JoinRefused(
                "service_account_token",
                "not a join token, and certmanager has no Kubernetes API to review a "
                "ServiceAccount token with (it runs outside a pod and without kubeconfig)",
            )
        try:
            component = await self._reviewer.component(token)
        except ReviewRefused as exc:
            raise JoinRefused(exc.reason, str(exc)) from None
        nonce, expires_at = spent_key_and_expiry(token)
        await self._spend(nonce, component, expires_at + 60)
        return component

    async def _spend(self, nonce: str, component: str, until: int) -> None:
        key = SPENT_KEY.format(nonce=nonce)
        try:
            fresh = await self._redis.set(key, component, nx=True, exat=until)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(f"cannot record the join token as used: {exc}") from exc
        if not fresh:
            raise JoinRefused("spent", "join token already used: a token works once")
        try:
            await redisconn.replicated(self._redis, replicas=self._min_replicas_ack)
        except (RedisError, OSError) as exc:  # NotReplicated: a failover could forget it
            with contextlib.suppress(RedisError, OSError):
                await self._redis.delete(key)  # unspent: the caller may retry with it
            raise StoreUnavailable(f"cannot record the join token as used: {exc}") from exc
