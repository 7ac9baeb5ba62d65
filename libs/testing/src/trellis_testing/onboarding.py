"""An onboarding token store in memory, for tests that build an admin app without Redis
(the fuzz suites); every rule but the storage is the real :class:`TokenStore`'s."""

from __future__ import annotations

import time
from collections.abc import Callable

from trellis_identity.onboarding import OnboardingToken, TokenStore


class InMemoryTokenStore(TokenStore):
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__(None, clock=clock)  # type: ignore[arg-type]  # no Redis: a dict
        self.records: dict[str, str] = {}
        self.counts: dict[str, int] = {}

    async def _put(self, record: OnboardingToken, ttl: float) -> None:
        self.records[record.id] = record.to_json()

    async def _get(self, token_id: str) -> bytes | str | None:
        return self.records.get(token_id)

    async def _all(self) -> list[bytes | str]:
        return list(self.records.values())

    async def _delete(self, token_id: str) -> bool:
        return self.records.pop(token_id, None) is not None

    async def _count(self, key: str, ttl: float) -> int:
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]

    async def _uncount(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) - 1
