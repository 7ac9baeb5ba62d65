"""Which service certificates are still asked for, as every certmanager replica saw it.

The rotation pass re-issues a due service certificate only if someone asked for it since it
was issued (the catalog asks every 30 s for each identity with proxies); one nobody asks
for is left to expire, then pruned. With several replicas the asks are spread over all of
them, and only the leader rotates. So each replica notes the asks it served
(:meth:`Demand.asked`), a standby shares them in the store every rotation interval
(:meth:`Demand.share`: one ``HSET`` of those newer than it last shared, in the hash
``trellis:certmanager:wanted``, common name -> unix time), and the leader reads them all
before each pass (:meth:`Demand.learn`). What the leader knows of an ask is at most one
rotation interval late, a small fraction of a certificate's renewal window.

A certificate the leader has never heard of counts as asked for when it first looks at it
(a record loaded at start, or issued elsewhere): certmanager cannot know better.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.store import CertificateStore


class Demand:
    """The last time each service certificate was asked for (module docstring)."""

    def __init__(self, store: CertificateStore, clock: Callable[[], dt.datetime]) -> None:
        self._store = store
        self._clock = clock
        self._asked: dict[str, dt.datetime] = {}  # common name -> last asked for
        self._shared: dict[str, dt.datetime] = {}  # common name -> last written to the store

    def asked(self, common_name: str) -> None:
        self._asked[common_name] = self._clock()

    def forget(self, common_name: str) -> None:
        self._asked.pop(common_name, None)
        self._shared.pop(common_name, None)

    def still_wanted(self, record: CertificateRecord) -> bool:
        """Someone asked for this service certificate since it was issued."""
        return self._asked.setdefault(record.common_name, self._clock()) >= record.not_before

    async def share(self) -> int:
        """Write the asks this replica served since it last shared; how many."""
        fresh = {
            name: at
            for name, at in self._asked.items()
            if name not in self._shared or self._shared[name] < at
        }
        if fresh:
            await self._store.share_asks({name: at.timestamp() for name, at in fresh.items()})
            self._shared |= fresh
        return len(fresh)

    async def learn(self) -> None:
        """Take in the asks every replica shared (the leader, before a pass)."""
        for name, seconds in (await self._store.load_asks()).items():
            at = dt.datetime.fromtimestamp(seconds, dt.UTC)
            if name not in self._asked or self._asked[name] < at:
                self._asked[name] = self._shared[name] = at
