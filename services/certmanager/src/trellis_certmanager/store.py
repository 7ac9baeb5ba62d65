"""Durable storage of the CA and the certificate records.

:class:`RedisCertificateStore` keeps the CA under one key written with ``SET NX`` (two
certmanagers starting together agree on one root) and the records in one hash keyed by
common name. Run Redis with persistence (``make run`` does: AOF, fsync always) and a restart
of certmanager or Redis loses nothing. In a cluster a Secret-backed store plugs into the
same :class:`CertificateStore` protocol.

Several certmanager replicas share one store: a write under a common name's claim, or a
rotation pass's fenced write, is one transaction that checks the claim first
(:mod:`trellis_certmanager.claims`), and :meth:`RedisCertificateStore.get` reads what is
stored now, for a replica to issue only when no other one already did. With
``min_replicas_ack`` set (Redis with replicas, under Sentinel), each record and revocation
write waits until that many Redis replicas have it before the caller is answered
(:meth:`RedisCertificateStore._acknowledged`), so a failover of the Redis master does not
lose it.

What is stored is not trusted on the way back:

* A write Redis does not take (down, frozen past the client's socket timeout, refusing) is
  a :class:`~trellis_certmanager.domain.errors.StoreUnavailable` naming Redis.
* A CA that cannot be read is a :class:`~trellis_certmanager.domain.errors.CAError` naming
  the key and the remedy. It is never treated as absent: that would make a new root.
* A record that does not parse, whose key does not unseal (another KEK, altered, copied
  from another record), or fails :func:`~trellis_certmanager.domain.records.check`
  (a bad PEM, a key that does not match, an invalid identity such as a service account
  ``Bad Name!`` stored by an older version), or sits under another common name, is left out
  of :attr:`Loaded.records` and listed in :attr:`Loaded.rejected` with where it lives
  (``<hash>[<common name>]``) and why. It stays in Redis until it is re-issued (overwritten)
  or deleted.

Private keys are sealed (:mod:`trellis_certmanager.domain.sealed`) under the KEK the store
is given (the CA's and service certificates'; proxy records have no key: proxies send a
CSR), with the place they are stored at as associated data: the CA's key with the CA's
Redis key, a record's key with ``<hash>[<common name>]``. Nothing in Redis is a key in the
clear. A CA or record written in the clear by an older version is read, then written back
sealed (only if it is still the value that was read: another certmanager may have replaced
it meanwhile), and a log line says so; the CA only once the manager has accepted it
(:meth:`RedisCertificateStore.seal_ca`), so a CA planted in the clear is not sealed over. A
proxy record an older version wrote with the proxy's key is written back the same way,
without the key.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from trellis_certmanager.claims import Claim, Claims
from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.errors import CAError, StoreUnavailable
from trellis_certmanager.domain.records import (
    SEALED_KEY_FIELD,
    CertificateRecord,
    check,
    in_the_clear,
    parse_body,
    without_proxy_key,
)
from trellis_certmanager.domain.revocation import Revocation
from trellis_certmanager.domain.sealed import Sealer, SealError
from trellis_runtime import redisatomic, redisconn, stored

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger(__name__)

#: What :meth:`CertificateStore.load_all` gives: the records, and those refused.
Loaded = stored.Loaded[CertificateRecord]
#: What :meth:`CertificateStore.load_revoked` gives.
LoadedRevocations = stored.Loaded[Revocation]


class CertificateStore(Protocol):
    async def load_ca(self) -> CertificateAuthority | None:
        """The stored CA, ``None`` if there is none; ``CAError`` if it cannot be read."""
        ...

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        """Store ``ca`` unless one is stored already; return the one in force."""
        ...

    async def replace_ca(self, ca: CertificateAuthority) -> None: ...

    async def seal_ca(self, ca: CertificateAuthority) -> bool:
        """Write ``ca``, accepted as the mesh's, back sealed if it is stored in the clear."""
        ...

    def hold(
        self, common_name: str, fence: int | None = None
    ) -> AbstractAsyncContextManager[Claim]:
        """Hold ``common_name`` against the other replicas (:mod:`..claims`)."""
        ...

    async def take_fence(self, token: int) -> None:
        """Take the rotation fence with ``token``; ``Deposed`` if a newer leader has it."""
        ...

    async def get(self, common_name: str) -> CertificateRecord | None:
        """The record stored now (``None``: none, or one refused); ``StoreUnavailable``."""
        ...

    async def put(self, record: CertificateRecord, claim: Claim | None = None) -> None: ...

    async def put_many(self, records: list[CertificateRecord]) -> None: ...

    async def delete_many(
        self, common_names: Sequence[str], claim: Claim | None = None
    ) -> None: ...

    async def load_all(self) -> Loaded: ...

    async def put_revoked(self, revocation: Revocation, claim: Claim | None = None) -> None: ...

    async def delete_revoked(self, serials: Sequence[int], claim: Claim | None = None) -> None: ...

    async def load_revoked(self) -> LoadedRevocations: ...

    async def share_asks(self, asks: dict[str, float]) -> None:
        """Note when service certificates were last asked for (unix time, by name)."""
        ...

    async def load_asks(self) -> dict[str, float]:
        """What :meth:`share_asks` noted, every replica's."""
        ...


def parse_record(
    common_name: str, raw: bytes | str, unseal: Callable[[str], bytes]
) -> CertificateRecord:
    """One stored record, checked; ``ValueError`` says what is wrong with it."""
    body = parse_body(raw)
    if body.get("common_name") != common_name:
        raise ValueError(
            f"stored under {common_name!r} but the record is for {body.get('common_name')!r}"
        )
    return check(CertificateRecord.from_body(body, unseal))


#: The CA's fields in the durable form, each base64 of the PEM; the key is sealed instead.
_SEALED_CA_KEY = "key_sealed"
_CLEAR_CA_KEY = "key_pem"


# Write ARGV[2] over a value only if it is still ARGV[1] (what was read and migrated).
class RedisCertificateStore:
    def __init__(
        self,
        redis: aioredis.Redis,
        sealer: Sealer,
        prefix: str = "trellis",
        *,
        claim_ttl: float = 5.0,
        refused: Counter | None = None,
        min_replicas_ack: int = 0,
        ack_timeout_ms: int = redisconn.REPLICATION_TIMEOUT_MS,
    ) -> None:
        self._redis = redis
        self._sealer = sealer
        self.claims = Claims(redis, prefix, claim_ttl, refused=refused)
        self._parsed: dict[str, tuple[bytes | str, CertificateRecord]] = {}  # cn -> last get
        self._min_replicas_ack = min_replicas_ack
        self._ack_timeout_ms = ack_timeout_ms
        self.ca_key = f"{prefix}:certmanager:ca"
        self.records_key = f"{prefix}:certmanager:certs"
        self.revoked_key = f"{prefix}:certmanager:revoked"  # hex serial -> revocation
        self.wanted_key = f"{prefix}:certmanager:wanted"  # common name -> last asked (unix)

    def location(self, common_name: str) -> str:
        """Where a record lives, as an operator would look for it."""
        return stored.location(self.records_key, common_name)

    async def load_ca(self) -> CertificateAuthority | None:
        try:
            raw = await self._redis.get(self.ca_key)
            if raw is None:
                return None
            ca, _ = self._decode_ca(raw)
        except (CAError, ResponseError) as exc:
            raise CAError(
                f"the CA stored in Redis key {self.ca_key!r} cannot be loaded ({exc}). "
                f"certmanager will not make a new root in its place. Restore that key from a "
                f"backup of Redis, or start certmanager with the mesh's CA files "
                f"(--ca-cert-file/--ca-key-file); only to start a new mesh root on purpose, "
                f"delete the key and the root-fingerprint marker in the state directory"
            ) from exc
        return ca

    async def seal_ca(self, ca: CertificateAuthority) -> bool:
        """Write ``ca`` back sealed under the current KEK if the store holds it in the clear
        (an older version wrote it) or sealed under a previous KEK (a KEK rotation); the
        manager calls this once it has accepted the CA as this mesh's, so a CA someone
        planted in the clear is never sealed over. ``True`` if it was."""
        raw = await self._redis.get(self.ca_key)
        if raw is None:
            return False
        try:
            stored, clear = self._decode_ca(raw)
            fields = json.loads(raw)
        except (CAError, ValueError):
            return False
        old_kek = isinstance(fields, dict) and self._sealer.stale(fields.get(_SEALED_CA_KEY))
        if not (clear or old_kek) or stored.cert != ca.cert:
            return False
        swapped = bool(await redisatomic.swap(self._redis, self.ca_key, raw, self._encode_ca(ca)))
        log.warning(
            "ca.key_sealed key=%s kek_id=%s migrated=%s",
            self.ca_key,
            self._sealer.current.id,
            swapped,
        )
        return swapped

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        if await self._redis.set(self.ca_key, self._encode_ca(ca), nx=True):
            return ca
        stored = await self.load_ca()
        return stored if stored is not None else ca

    async def replace_ca(self, ca: CertificateAuthority) -> None:
        await self._redis.set(self.ca_key, self._encode_ca(ca))

    @contextlib.asynccontextmanager
    async def hold(self, common_name: str, fence: int | None = None) -> AsyncIterator[Claim]:
        async with self.claims.hold(common_name, fence) as claim:
            yield claim

    async def take_fence(self, token: int) -> None:
        await self.claims.take_fence(token)

    async def get(self, common_name: str) -> CertificateRecord | None:
        try:
            raw = await self._redis.hget(self.records_key, common_name)
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc
        if raw is None:
            self._parsed.pop(common_name, None)
            return None
        cached = self._parsed.get(common_name)
        if cached is not None and cached[0] == raw:  # read again unchanged: parsed once
            return cached[1]
        where = self.location(common_name)
        try:
            record = parse_record(common_name, raw, lambda text: self._sealer.unseal(text, where))
        except ValueError as exc:  # refused as at load: re-issuing overwrites it
            log.warning("cert.stored_record_refused where=%s error=%r", where, str(exc))
            return None
        self._parsed[common_name] = (raw, record)
        return record

    async def put(self, record: CertificateRecord, claim: Claim | None = None) -> None:
        encoded = self._encode(record)
        await self._write(
            claim, lambda pipe: pipe.hset(self.records_key, record.common_name, encoded)
        )

    async def put_many(self, records: list[CertificateRecord]) -> None:
        if records:
            mapping = {r.common_name: self._encode(r) for r in records}
            await self._write(None, lambda pipe: pipe.hset(self.records_key, mapping=mapping))

    async def delete_many(self, common_names: Sequence[str], claim: Claim | None = None) -> None:
        if common_names:
            names = list(common_names)
            for name in names:
                self._parsed.pop(name, None)

            def delete(pipe: Any) -> None:
                pipe.hdel(self.records_key, *names)
                pipe.hdel(self.wanted_key, *names)

            await self._write(claim, delete)

    async def _write(self, claim: Claim | None, queue: Callable[[Any], None]) -> None:
        """One transaction of writes, guarded by ``claim`` (if any), then acknowledged."""
        await self.claims.write(claim, queue)
        await self._acknowledged()

    async def _acknowledged(self) -> None:
        """Wait until ``min_replicas_ack`` Redis replicas have the writes made so far
        (:func:`trellis_runtime.redisconn.replicated`, Redis ``WAIT``), so that a failover
        of the master does not lose them: fewer in time is StoreUnavailable (the caller
        retries; the write may stay on the master)."""
        if self._min_replicas_ack <= 0:
            return
        try:
            await redisconn.replicated(
                self._redis, replicas=self._min_replicas_ack, timeout_ms=self._ack_timeout_ms
            )
        except (RedisError, OSError) as exc:  # NotReplicated is a RedisError
            raise _unavailable(exc) from exc

    async def load_all(self) -> Loaded:
        clear: dict[str, tuple[bytes | str, CertificateRecord]] = {}
        proxy_keys: set[str] = set()
        found_in_clear: set[str] = set()
        resealed: set[str] = set()  # sealed under a previous KEK

        def parse(common_name: str, raw: bytes | str) -> CertificateRecord:
            where = self.location(common_name)
            record = parse_record(
                common_name, raw, lambda sealed: self._sealer.unseal(sealed, where)
            )
            keyless = without_proxy_key(record)
            if keyless is not None:  # a proxy's key from before issuance by CSR: dropped
                record = keyless
                proxy_keys.add(common_name)
            body = parse_body(raw)
            if in_the_clear(body):
                found_in_clear.add(common_name)
            if self._sealer.stale(body.get(SEALED_KEY_FIELD)):
                resealed.add(common_name)
            if keyless is not None or common_name in found_in_clear | resealed:
                clear[common_name] = (raw, record)
            return record

        loaded = await stored.load_hash(self._redis, self.records_key, parse, "certificate records")
        if clear:
            await self._seal_records(clear, len(found_in_clear), len(proxy_keys), len(resealed))
        return loaded

    async def _seal_records(
        self,
        clear: dict[str, tuple[bytes | str, CertificateRecord]],
        found_in_clear: int,
        proxy_keys: int,
        old_kek: int = 0,
    ) -> None:
        """Write back the records read in the clear sealed, and the proxy records read with
        a key without it (those nobody changed since)."""
        migrated = 0
        for common_name, (raw, record) in clear.items():
            try:
                swapped = await redisatomic.swap(
                    self._redis, self.records_key, raw, self._encode(record), field=common_name
                )
            except (RedisError, OSError) as exc:  # the next load tries again
                log.warning("cert.seal_deferred cn=%s error=%r", common_name, str(exc))
                continue
            migrated += 1 if swapped else 0
        log.warning(
            "cert.keys_sealed key=%s found_in_clear=%d under_old_kek=%d migrated=%d kek_id=%s "
            "proxy_keys_dropped=%d",
            self.records_key,
            found_in_clear,
            old_kek,
            migrated,
            self._sealer.current.id,
            proxy_keys,
        )

    async def put_revoked(self, revocation: Revocation, claim: Claim | None = None) -> None:
        field, body = f"{revocation.serial:x}", revocation.to_json()
        await self._write(claim, lambda pipe: pipe.hset(self.revoked_key, field, body))

    async def delete_revoked(self, serials: Sequence[int], claim: Claim | None = None) -> None:
        if serials:
            fields = [f"{s:x}" for s in serials]
            await self._write(claim, lambda pipe: pipe.hdel(self.revoked_key, *fields))

    async def load_revoked(self) -> LoadedRevocations:
        try:
            return await stored.load_hash(
                self._redis, self.revoked_key, Revocation.from_json, "revocations"
            )
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc

    async def share_asks(self, asks: dict[str, float]) -> None:
        try:
            await self._redis.hset(self.wanted_key, mapping={k: str(v) for k, v in asks.items()})
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc

    async def load_asks(self) -> dict[str, float]:
        try:
            raw = await self._redis.hgetall(self.wanted_key)
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc
        asks = {}
        for name, value in raw.items():
            try:
                asks[_text(name)] = float(value)
            except ValueError:  # not ours to judge: it is overwritten by the next ask
                continue
        return asks

    def _encode(self, record: CertificateRecord) -> str:
        where = self.location(record.common_name)
        return record.to_json(lambda pem: self._sealer.seal(pem, where))

    def _encode_ca(self, ca: CertificateAuthority) -> str:
        pems = ca.to_pems()
        body = {k: base64.b64encode(v).decode() for k, v in pems.items() if k != _CLEAR_CA_KEY}
        body[_SEALED_CA_KEY] = self._sealer.seal(pems[_CLEAR_CA_KEY], self.ca_key)
        return json.dumps(body)

    def _decode_ca(self, raw: bytes | str) -> tuple[CertificateAuthority, bool]:
        """The CA, and whether its key was stored in the clear (by an older version)."""
        try:
            fields = json.loads(raw)
            if not isinstance(fields, dict):
                raise ValueError(f"expected a JSON object, got {type(fields).__name__}")
            sealed = fields.pop(_SEALED_CA_KEY, None)
            pems = {k: base64.b64decode(v, validate=True) for k, v in fields.items()}
            if sealed is not None:
                if not isinstance(sealed, str):
                    raise ValueError(f"{_SEALED_CA_KEY} is not a string")
                pems[_CLEAR_CA_KEY] = self._sealer.unseal(sealed, self.ca_key)
        except SealError as exc:
            raise CAError(f"its key cannot be unsealed: {exc}") from exc
        except (ValueError, TypeError, binascii.Error) as exc:
            raise CAError(f"stored CA is unreadable: {exc}") from exc
        return CertificateAuthority.from_pems(pems), sealed is None


def _unavailable(exc: BaseException) -> StoreUnavailable:
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return StoreUnavailable(
        f"the certificate store (Redis) did not take the write ({detail}); nothing was "
        "issued or changed; retry once Redis is back"
    )


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
