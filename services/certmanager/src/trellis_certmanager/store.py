"""Durable storage of the CA and the certificate records.

:class:`RedisCertificateStore` keeps the CA under one key written with ``SET NX`` (two
certmanagers starting together agree on one root) and the records in one hash keyed by
common name. Run Redis with persistence (``make run`` does: AOF, fsync always) and a restart
of certmanager or Redis loses nothing. In a cluster a Secret-backed store plugs into the
same :class:`CertificateStore` protocol.
"""

from __future__ import annotations

import base64
import json
from typing import Protocol

import redis.asyncio as aioredis

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.records import CertificateRecord


class CertificateStore(Protocol):
    async def load_ca(self) -> CertificateAuthority | None: ...

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        """Store ``ca`` unless one is stored already; return the one in force."""
        ...

    async def replace_ca(self, ca: CertificateAuthority) -> None: ...

    async def put(self, record: CertificateRecord) -> None: ...

    async def put_many(self, records: list[CertificateRecord]) -> None: ...

    async def load_all(self) -> list[CertificateRecord]: ...


def _encode_ca(ca: CertificateAuthority) -> str:
    return json.dumps({k: base64.b64encode(v).decode() for k, v in ca.to_pems().items()})


def _decode_ca(raw: bytes | str) -> CertificateAuthority:
    fields = json.loads(raw)
    return CertificateAuthority.from_pems({k: base64.b64decode(v) for k, v in fields.items()})


class RedisCertificateStore:
    def __init__(self, redis: aioredis.Redis, prefix: str = "trellis") -> None:
        self._redis = redis
        self._ca_key = f"{prefix}:certmanager:ca"
        self._records_key = f"{prefix}:certmanager:certs"

    async def load_ca(self) -> CertificateAuthority | None:
        raw = await self._redis.get(self._ca_key)
        return None if raw is None else _decode_ca(raw)

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        if await self._redis.set(self._ca_key, _encode_ca(ca), nx=True):
            return ca
        stored = await self.load_ca()
        return stored if stored is not None else ca

    async def replace_ca(self, ca: CertificateAuthority) -> None:
        await self._redis.set(self._ca_key, _encode_ca(ca))

    async def put(self, record: CertificateRecord) -> None:
        await self._redis.hset(self._records_key, record.common_name, record.to_json())

    async def put_many(self, records: list[CertificateRecord]) -> None:
        if records:
            await self._redis.hset(
                self._records_key, mapping={r.common_name: r.to_json() for r in records}
            )

    async def load_all(self) -> list[CertificateRecord]:
        raw = await self._redis.hgetall(self._records_key)
        return [CertificateRecord.from_json(v) for v in raw.values()]
