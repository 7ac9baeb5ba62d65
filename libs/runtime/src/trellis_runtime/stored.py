"""Records a service keeps in one Redis hash: loaded one by one, refused ones kept apart.

certmanager (certificate records) and endpoints-vm (workload registrations) both keep their
records as fields of a Redis hash. A record that fails to parse (written by an older
version, or by hand) must not stop the service from loading the others: it is
:class:`Rejected` with its reason, reported on ``Health.rejections`` by :class:`Refused`,
and stays refused until the service overwrites or deletes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from trellis_runtime.health import Rejections

T = TypeVar("T")


def location(key: str, field: str) -> str:
    """Where a record lives, as an operator would look for it: ``key[field]``."""
    return f"{key}[{field}]"


@dataclass(frozen=True, slots=True)
class Rejected:
    """A stored record that was not loaded: ``key`` is where it lives, ``reason`` why."""

    field: str
    key: str
    reason: str


@dataclass(frozen=True)  # no slots: typing sets __orig_class__ on Loaded[X](...)
class Loaded(Generic[T]):
    records: list[T]
    rejected: list[Rejected]


async def load_hash(
    redis: aioredis.Redis, key: str, parse: Callable[[str, bytes | str], T], what: str
) -> Loaded[T]:
    """Every field of the hash ``key`` through ``parse`` (raising ``ValueError`` with the
    reason for a bad one). A key that is not a hash is one rejection, not an error."""
    try:
        raw = await redis.hgetall(key)
    except ResponseError as exc:  # WRONGTYPE: something else wrote this key
        return Loaded([], [Rejected("", key, f"not a hash of {what}: {exc}")])
    records, rejected = [], []
    for raw_field, value in raw.items():
        field = _text(raw_field)
        try:
            records.append(parse(field, value))
        except ValueError as exc:
            rejected.append(Rejected(field, location(key, field), str(exc)))
    return Loaded(records, rejected)


class Refused:
    """The stored records refused at load and still in the store, by field."""

    def __init__(self, rejections: Rejections | None, source: str) -> None:
        self._rejections = rejections
        self._source = source
        self._keys: dict[str, str] = {}  # field -> where it lives

    def add(self, rejected: Rejected) -> None:
        self._keys[rejected.field] = rejected.key
        if self._rejections is not None:
            self._rejections.reject(self._source, rejected.key, rejected.reason)

    def overwritten(self, field: str) -> None:
        """The record was overwritten or deleted: it is no longer refused."""
        key = self._keys.pop(field, None)
        if key is not None and self._rejections is not None:
            self._rejections.accept(self._source, key)

    def fields(self) -> list[str]:
        return sorted(self._keys)

    def __contains__(self, field: object) -> bool:
        return field in self._keys

    def __len__(self) -> int:
        return len(self._keys)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
