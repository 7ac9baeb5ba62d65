"""Durable storage of the CA and the certificate records.

:class:`RedisCertificateStore` keeps the CA under one key written with ``SET NX`` (two
certmanagers starting together agree on one root) and the records in one hash keyed by
common name. Run Redis with persistence (``make run`` does: AOF, fsync always) and a restart
of certmanager or Redis loses nothing. In a cluster a Secret-backed store plugs into the
same :class:`CertificateStore` protocol.

What is stored is not trusted on the way back:

* A write Redis does not take (down, frozen past the client's socket timeout, refusing) is
  a :class:`~trellis_certmanager.domain.errors.StoreUnavailable` naming Redis.
* A CA that cannot be read is a :class:`~trellis_certmanager.domain.errors.CAError` naming
  the key and the remedy. It is never treated as absent: that would make a new root.
* A record that does not parse, or fails :func:`~trellis_certmanager.domain.records.check`
  (a bad PEM, a key that does not match, an invalid identity such as a service account
  ``Bad Name!`` stored by an older version), or sits under another common name, is left out
  of :attr:`Loaded.records` and listed in :attr:`Loaded.rejected` with where it lives
  (``<hash>[<common name>]``) and why. It stays in Redis until it is re-issued (overwritten)
  or deleted.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.errors import CAError, StoreUnavailable
from trellis_certmanager.domain.records import CertificateRecord, check
from trellis_certmanager.domain.revocation import Revocation
from trellis_common import stored

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

    async def put(self, record: CertificateRecord) -> None: ...

    async def put_many(self, records: list[CertificateRecord]) -> None: ...

    async def delete_many(self, common_names: Sequence[str]) -> None: ...

    async def load_all(self) -> Loaded: ...

    async def put_revoked(self, revocation: Revocation) -> None: ...

    async def delete_revoked(self, serials: Sequence[int]) -> None: ...

    async def load_revoked(self) -> LoadedRevocations: ...


def parse_record(common_name: str, raw: bytes | str) -> CertificateRecord:
    """One stored record, checked; ``ValueError`` says what is wrong with it."""
    record = check(CertificateRecord.from_json(raw))
    if record.common_name != common_name:
        raise ValueError(
            f"stored under {common_name!r} but the record is for {record.common_name!r}"
        )
    return record


def _encode_ca(ca: CertificateAuthority) -> str:
    return json.dumps({k: base64.b64encode(v).decode() for k, v in ca.to_pems().items()})


def _decode_ca(raw: bytes | str) -> CertificateAuthority:
    try:
        fields = json.loads(raw)
        if not isinstance(fields, dict):
            raise ValueError(f"expected a JSON object, got {type(fields).__name__}")
        pems = {k: base64.b64decode(v, validate=True) for k, v in fields.items()}
    except (ValueError, TypeError, binascii.Error) as exc:
        raise CAError(f"stored CA is unreadable: {exc}") from exc
    return CertificateAuthority.from_pems(pems)


class RedisCertificateStore:
    def __init__(self, redis: aioredis.Redis, prefix: str = "trellis") -> None:
        self._redis = redis
        self.ca_key = f"{prefix}:certmanager:ca"
        self.records_key = f"{prefix}:certmanager:certs"
        self.revoked_key = f"{prefix}:certmanager:revoked"  # hex serial -> revocation

    def location(self, common_name: str) -> str:
        """Where a record lives, as an operator would look for it."""
        return stored.location(self.records_key, common_name)

    async def load_ca(self) -> CertificateAuthority | None:
        try:
            raw = await self._redis.get(self.ca_key)
            return None if raw is None else _decode_ca(raw)
        except (CAError, ResponseError) as exc:
            raise CAError(
                f"the CA stored in Redis key {self.ca_key!r} cannot be loaded ({exc}). "
                f"certmanager will not make a new root in its place. Restore that key from a "
                f"backup of Redis, or start certmanager with the mesh's CA files "
                f"(--ca-cert-file/--ca-key-file); only to start a new mesh root on purpose, "
                f"delete the key and the root-fingerprint marker in the state directory"
            ) from exc

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        if await self._redis.set(self.ca_key, _encode_ca(ca), nx=True):
            return ca
        stored = await self.load_ca()
        return stored if stored is not None else ca

    async def replace_ca(self, ca: CertificateAuthority) -> None:
        await self._redis.set(self.ca_key, _encode_ca(ca))

    async def put(self, record: CertificateRecord) -> None:
        await self.put_many([record])

    async def put_many(self, records: list[CertificateRecord]) -> None:
        if records:
            try:
                await self._redis.hset(
                    self.records_key, mapping={r.common_name: r.to_json() for r in records}
                )
            except (RedisError, OSError) as exc:
                raise _unavailable(exc) from exc

    async def delete_many(self, common_names: Sequence[str]) -> None:
        if common_names:
            try:
                await self._redis.hdel(self.records_key, *common_names)
            except (RedisError, OSError) as exc:
                raise _unavailable(exc) from exc

    async def load_all(self) -> Loaded:
        return await stored.load_hash(
            self._redis, self.records_key, parse_record, "certificate records"
        )

    async def put_revoked(self, revocation: Revocation) -> None:
        try:
            await self._redis.hset(self.revoked_key, f"{revocation.serial:x}", revocation.to_json())
        except (RedisError, OSError) as exc:
            raise _unavailable(exc) from exc

    async def delete_revoked(self, serials: Sequence[int]) -> None:
        if serials:
            try:
                await self._redis.hdel(self.revoked_key, *(f"{s:x}" for s in serials))
            except (RedisError, OSError) as exc:
                raise _unavailable(exc) from exc

    async def load_revoked(self) -> LoadedRevocations:
        return await stored.load_hash(
            self._redis, self.revoked_key, Revocation.from_json, "revocations"
        )


def _unavailable(exc: BaseException) -> StoreUnavailable:
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return StoreUnavailable(
        f"the certificate store (Redis) did not take the write ({detail}); nothing was "
        "issued or changed; retry once Redis is back"
    )


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
