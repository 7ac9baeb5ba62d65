"""Scoped onboarding tokens: onboarding one identity without the admin token.

An operator makes one with ``trellis token create --namespace NS --service SVC
--service-account SA --ttl 1h [--uses N]`` (the injector's admin REST, which needs the admin
token). The token is valid for that namespace, service and service account only, until it
expires or is revoked, and for ``uses`` workloads (1 by default): the injector onboards a
proxy of that identity with it (``POST /v1/bootstrap``) and endpoints-vm registers a
workload of it (``POST /v1/workloads``), each at most ``uses`` times (a VM does both once).
Anything else is refused, and each service logs and counts the refusal with the
:class:`Refusal` as its reason. The admin token stays for operators.

Uses are counted by the service that takes them, in its own Redis keys
(``<prefix>:<service>:onboarding-uses:<id>``, SET NX with the token's lifetime, then INCR;
given back with DECR when the onboarding fails on a dependency), so a token onboards no
more proxies than it says however many callers race with it.

A token is ``trellis-onb.<id>.<secret>``: the id names it in listings, logs and ``trellis
token revoke``; the secret (32 random bytes) is what proves it. The token is shown once, at
creation, and never logged or stored: Redis holds, per token, one key
``<prefix>:injector:onboarding-tokens:<id>`` with what it is for and the SHA-256 of the whole
token (a digest suffices for 256 random bits; no password hashing is needed), set to expire
with the token. So a reader of Redis learns which identities may be onboarded, never a
token that onboards one. The injector owns the keys; endpoints-vm only reads them.

No token is made for the control plane's namespace (``trellis-system``): its identities are
never onboarded (certmanager refuses their proxy certificates, the injector answers 422).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import redis.asyncio as aioredis

from trellis_common import ids
from trellis_identity.tokens import AdminToken

TOKEN_PREFIX: Final = "trellis-onb"
_TOKEN = re.compile(rf"^{re.escape(TOKEN_PREFIX)}\.([0-9a-f]{{16}})\.([A-Za-z0-9_-]{{43}})$")
#: The longest a token may live: onboarding is a moment, not a standing credential.
MAX_TTL: Final = 7 * 24 * 3600.0
MIN_TTL: Final = 60.0
CONTROL_PLANE_NAMESPACE: Final = "trellis-system"


class Refusal(enum.StrEnum):
    """Why a bearer token was not accepted (the ``reason`` label of the refusal metrics)."""

    NO_TOKEN = "no-token"
    MALFORMED = "malformed-token"  # neither the admin token nor an onboarding token
    UNKNOWN = "unknown-token"  # well formed, but not on record (never made, revoked, expired)
    EXPIRED = "expired"
    WRONG_IDENTITY = "wrong-identity"  # a token for another namespace, service or account
    USED_UP = "used-up"  # every use the token allows was taken


class TokenRefused(Exception):
    """A bearer token does not allow what was asked; ``reason`` is a :class:`Refusal`,
    ``token_id`` the onboarding token's id (``-`` if there is none)."""

    def __init__(self, reason: Refusal, detail: str, token_id: str = "-") -> None:  # noqa: S107
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.token_id = token_id

    @property
    def status(self) -> int:
        return 401 if self.reason is Refusal.NO_TOKEN else 403


class InvalidTokenRequest(ValueError):
    """A token cannot be made as asked; ``field`` names what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def digest(token: str) -> str:
    """The SHA-256 of a token, hex: what is stored and compared, never the token."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_id(token: str) -> str | None:
    """The id of a well-formed onboarding token, ``None`` for anything else."""
    found = _TOKEN.match(token)
    return found.group(1) if found else None


@dataclass(frozen=True, slots=True)
class OnboardingToken:
    """What a token is for; the token itself is not here, only its digest."""

    id: str
    namespace: str
    service_account: str
    created_at: float
    expires_at: float
    digest: str = field(repr=False)
    service: str = ""  # "" only in records made before tokens named their service
    uses: int = 1

    def allows(self, namespace: str, service: str, service_account: str) -> bool:
        return (namespace, service, service_account) == (
            self.namespace,
            self.service,
            self.service_account,
        )

    @property
    def identity(self) -> str:
        return f"{self.namespace}/{self.service} (service account {self.service_account})"

    def metadata(self) -> dict[str, Any]:
        """Everything but the digest: for listings and answers."""
        body = asdict(self)
        del body["digest"]
        return body

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> OnboardingToken:
        try:
            body = json.loads(text)
            return cls(
                id=str(body["id"]),
                namespace=str(body["namespace"]),
                service_account=str(body["service_account"]),
                created_at=float(body["created_at"]),
                expires_at=float(body["expires_at"]),
                digest=str(body["digest"]),
                service=str(body.get("service", "")),
                uses=int(body.get("uses", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed onboarding token record: {exc!r}") from exc


#: The most workloads one token may onboard.
MAX_USES: Final = 1000


def check_request(
    namespace: str, service: str, service_account: str, ttl: float, uses: int = 1
) -> None:
    """:class:`InvalidTokenRequest` naming the first bad field."""
    try:
        ids.validate_dns_label(namespace, "namespace")
    except ids.InvalidIdentifier as exc:
        raise InvalidTokenRequest("namespace", f"{exc.reason}, got {namespace!r}") from None
    try:
        ids.validate_dns_label(service, "service")
    except ids.InvalidIdentifier as exc:
        raise InvalidTokenRequest("service", f"{exc.reason}, got {service!r}") from None
    if not 1 <= uses <= MAX_USES:
        raise InvalidTokenRequest("uses", f"must be between 1 and {MAX_USES}, got {uses}")
    if namespace == CONTROL_PLANE_NAMESPACE:
        raise InvalidTokenRequest(
            "namespace",
            f"{namespace!r} is the control plane's namespace: its identities cannot be onboarded",
        )
    try:
        ids.validate_dns_subdomain(service_account, "service account")
    except ids.InvalidIdentifier as exc:
        raise InvalidTokenRequest(
            "service_account", f"{exc.reason}, got {service_account!r}"
        ) from None
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise InvalidTokenRequest(
            "ttl", f"must be between {MIN_TTL:g}s and {MAX_TTL:g}s (7 days), got {ttl:g}s"
        )


class TokenStore:
    """Onboarding tokens in Redis, one key each, expiring with the token."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str = "trellis",
        clock: Callable[[], float] = time.time,
        counter: str = "injector",
    ) -> None:
        self._redis = redis
        self._clock = clock
        self._base = f"{prefix}:injector:onboarding-tokens:"
        #: where this service counts the uses it takes (its own keys)
        self._uses = f"{prefix}:{counter}:onboarding-uses:"

    def key(self, token_id: str) -> str:
        return self._base + token_id

    async def create(
        self, namespace: str, service: str, service_account: str, ttl: float, uses: int = 1
    ) -> tuple[str, OnboardingToken]:
        """A new token for one service's workloads (``uses`` of them): (the token, its
        record)."""
        check_request(namespace, service, service_account, ttl, uses)
        now = self._clock()
        made_id = secrets.token_hex(8)
        token = f"{TOKEN_PREFIX}.{made_id}.{secrets.token_urlsafe(32)}"
        record = OnboardingToken(
            made_id, namespace, service_account, now, now + ttl, digest(token), service, uses
        )
        await self._put(record, ttl)
        return token, record

    async def take_use(self, record: OnboardingToken) -> None:
        """Count one use of ``record`` here; :class:`TokenRefused` (``used-up``) once all
        it allows are taken (the count stays, so later tries are refused too)."""
        key = self._uses + record.id
        left = max(record.expires_at - self._clock(), 1.0)
        taken = await self._count(key, left)
        if taken > record.uses:
            raise TokenRefused(
                Refusal.USED_UP,
                f"onboarding token {record.id} allows {record.uses} workload(s), and "
                f"{record.uses} {'was' if record.uses == 1 else 'were'} onboarded with it: "
                "ask the operator for a new one (`trellis token create`)",
                record.id,
            )

    async def give_back(self, record: OnboardingToken) -> None:
        """Undo :meth:`take_use` when the onboarding failed on a dependency."""
        await self._uncount(self._uses + record.id)

    async def active(self) -> list[OnboardingToken]:
        """Every token not yet expired, oldest first (records that do not parse skipped)."""
        found = []
        now = self._clock()
        for raw in await self._all():
            try:
                record = OnboardingToken.from_json(raw)
            except ValueError:
                continue
            if record.expires_at > now:
                found.append(record)
        return sorted(found, key=lambda r: (r.created_at, r.id))

    async def revoke(self, token_id: str) -> bool:
        """Delete a token; ``False`` if there was none by that id."""
        return await self._delete(token_id)

    async def verify(self, token: str) -> OnboardingToken:
        """The record of a valid token; :class:`TokenRefused` otherwise."""
        found_id = token_id(token)
        if found_id is None:
            raise TokenRefused(Refusal.MALFORMED, "token rejected: not a token of this mesh")
        raw = await self._get(found_id)
        record = None
        if raw is not None:
            try:
                record = OnboardingToken.from_json(raw)
            except ValueError:
                record = None
        if record is None or not hmac.compare_digest(record.digest, digest(token)):
            raise TokenRefused(
                Refusal.UNKNOWN,
                f"onboarding token {found_id} is not on record (revoked, expired or never "
                "made): ask the operator for a new one (`trellis token create`)",
                found_id,
            )
        if record.expires_at <= self._clock():
            raise TokenRefused(
                Refusal.EXPIRED, f"onboarding token {found_id} has expired", found_id
            )
        return record

    # -- Redis: one key per token (SET with PX and NX, GET, SCAN and MGET, DEL) ----------

    async def _put(self, record: OnboardingToken, ttl: float) -> None:
        await self._redis.set(self.key(record.id), record.to_json(), px=int(ttl * 1000), nx=True)

    async def _get(self, token_id: str) -> bytes | str | None:
        raw: bytes | str | None = await self._redis.get(self.key(token_id))
        return raw

    async def _all(self) -> list[bytes | str]:
        keys = [k async for k in self._redis.scan_iter(match=self._base + "*", count=500)]
        values = await self._redis.mget(keys) if keys else []
        return [v for v in values if v is not None]  # None: expired since the scan

    async def _delete(self, token_id: str) -> bool:
        return bool(await self._redis.delete(self.key(token_id)))

    async def _count(self, key: str, ttl: float) -> int:
        await self._redis.set(key, 0, px=int(ttl * 1000), nx=True)  # INCR keeps the expiry
        return int(await self._redis.incr(key))

    async def _uncount(self, key: str) -> None:
        await self._redis.decr(key)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request came from: the operator (admin token) or an onboarding token."""

    token: OnboardingToken | None  # None: the admin token

    @property
    def token_id(self) -> str:
        return self.token.id if self.token is not None else "admin"

    def check(self, namespace: str, service: str, service_account: str) -> None:
        """:class:`TokenRefused` (``wrong-identity``) unless this caller may act for
        ``namespace``/``service`` under ``service_account``."""
        token = self.token
        if token is None or token.allows(namespace, service, service_account):
            return
        raise TokenRefused(
            Refusal.WRONG_IDENTITY,
            f"onboarding token {token.id} is for {token.identity}, not "
            f"{namespace}/{service} (service account {service_account})",
            token.id,
        )


async def authenticate(bearer: str | None, admin_token: AdminToken, store: TokenStore) -> Caller:
    """The caller of a request whose bearer token is ``bearer``: the admin token, or a
    valid onboarding token (:class:`TokenRefused` otherwise). Compared in constant time."""
    if not bearer:
        raise TokenRefused(
            Refusal.NO_TOKEN,
            "send 'Authorization: Bearer <token>': the admin token, or an onboarding token "
            "for this identity (`trellis token create`)",
        )
    if admin_token.matches(bearer):
        return Caller(None)
    return Caller(await store.verify(bearer))
