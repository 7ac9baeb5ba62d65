"""The records one certmanager replica holds in memory, coherent with the shared store.

Every replica serves reads (get, list, an issue request the current certificate
satisfies) from memory, so they keep working while Redis is away. With several replicas on
one store, memory is only a copy: another replica may issue, rotate, revoke or prune any
common name. :class:`HeldRecords` keeps the copy coherent:

- every change of one common name is made under :meth:`HeldRecords.exclusive`: this
  process's lock of the name, then its claim across replicas (:mod:`.claims`); under it
  :meth:`HeldRecords.stored` reads the record stored now, so a replica decides on what
  another one wrote, never on its own stale copy;
- the ``certificates`` signals of every replica (:mod:`.coherence`) call
  :meth:`HeldRecords.refresh` for the name they carry (under the same process lock, so a
  refresh and a local change of one name never interleave), and a resync calls
  :meth:`HeldRecords.reload`, which leaves alone the names changed here while it read;
- :meth:`HeldRecords.lookup` reads one record through to the store, for the reads that a
  consumer makes right after a signal (the other replica's signal may reach the consumer
  before it reaches this replica); while Redis is away it answers from memory.

A Redis that lost its data (restarted empty) is refilled from memory by the store guard
(:mod:`trellis_certmanager.custody`): until then neither a resync nor a lookup drops what
memory holds (:meth:`CertificateManager.reload` checks that the CA is still stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator

from trellis_certmanager.claims import Claim
from trellis_certmanager.domain.errors import StoreUnavailable
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.store import CertificateStore, Loaded
from trellis_runtime.stored import Refused

log = logging.getLogger(__name__)


class HeldRecords:
    """This replica's copy of the records, by common name (see the module docstring)."""

    def __init__(self, store: CertificateStore, rejected: Refused) -> None:
        self._store = store
        self._rejected = rejected  # stored records refused (reported once, by common name)
        self._records: dict[str, CertificateRecord] = {}
        self._locks: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # cn -> (lock, [users])
        self._generation = 0  # counts the changes placed in memory
        self._reloads = 0  # reloads under way: they must not undo changes placed meanwhile
        self._placed: dict[str, int] = {}  # cn -> generation of its last change, meanwhile

    def get(self, common_name: str) -> CertificateRecord | None:
        return self._records.get(common_name)

    def __len__(self) -> int:
        return len(self._records)

    def values(self) -> Iterator[CertificateRecord]:
        return iter(list(self._records.values()))

    def place(self, common_name: str, record: CertificateRecord | None) -> None:
        """Hold ``record`` as ``common_name``'s (``None``: it has none any more)."""
        if record is None:
            self._records.pop(common_name, None)
        else:
            self._records[common_name] = record
        self._generation += 1
        if self._reloads:
            self._placed[common_name] = self._generation

    def forget(self, common_names: Iterable[str]) -> int:
        """Drop these from memory (not from the store), unless one is being changed now."""
        gone = [n for n in common_names if n in self._records and n not in self._locks]
        for name in gone:
            self.place(name, None)
        return len(gone)

    @contextlib.asynccontextmanager
    async def local(self, common_name: str) -> AsyncIterator[None]:
        """Hold this process's lock of one common name; forgotten when nobody needs it."""
        lock, users = self._locks.setdefault(common_name, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._locks[common_name]

    @contextlib.asynccontextmanager
    async def exclusive(self, common_name: str, fence: int | None = None) -> AsyncIterator[Claim]:
        """Hold ``common_name`` in this process and against every other replica; writes
        made under it go with the claim yielded (a rotation pass's with its ``fence``)."""
        async with self.local(common_name), self._store.hold(common_name, fence) as claim:
            yield claim

    async def stored(self, common_name: str) -> CertificateRecord | None:
        """The record stored now (under :meth:`exclusive`), held from now on."""
        record = await self._store.get(common_name)
        self.place(common_name, record)
        return record

    async def current_or(
        self,
        common_name: str,
        fits: Callable[[CertificateRecord], bool],
        issue: Callable[[CertificateRecord | None, Claim], Awaitable[CertificateRecord]],
    ) -> CertificateRecord:
        """The current certificate of ``common_name`` if it ``fits`` (the one held here,
        else the one stored now, under the claim: another replica's, maybe), else a new
        one (``issue``, under the claim, given the current one if any)."""
        held = self._records.get(common_name)
        if held is not None and fits(held):
            return held
        async with self.exclusive(common_name) as claim:
            current = await self.stored(common_name)
            if current is not None and fits(current):
                return current
            return await issue(current, claim)

    async def delete_if(
        self,
        common_name: str,
        condition: Callable[[CertificateRecord], bool],
        fence: int | None = None,
    ) -> CertificateRecord | None:
        """Delete ``common_name``'s record if, as stored now, it meets ``condition``
        (pruning; ``fence``: the rotation leader's token); the record deleted, if any."""
        async with self.exclusive(common_name, fence) as claim:
            record = await self.stored(common_name)
            if record is None or not condition(record):
                return None
            await self._store.delete_many([common_name], claim)
            self.place(common_name, None)
            return record

    async def refresh(self, common_name: str) -> CertificateRecord | None:
        """Read ``common_name`` again from the store (a signal named it). Gone from a store
        that still has its CA: revoked or pruned by another replica, dropped here; gone from
        one without (Redis lost its data, the store guard refills it): kept."""
        async with self.local(common_name):
            record = await self._store.get(common_name)
            if record is None and await self._store.load_ca() is None:
                log.warning("cert.refresh_skipped cn=%s reason=store_lost_its_data", common_name)
                return self._records.get(common_name)
            self.place(common_name, record)
        if record is not None:  # a refused one was overwritten by another replica
            self._rejected.overwritten(common_name)
        return record

    async def lookup(self, common_name: str) -> CertificateRecord | None:
        """The record stored now, held from now on; the one held if the store has none (a
        wiped Redis, until the store guard refills it: another replica's deletion is
        dropped by its signal) or cannot be read."""
        try:
            async with self.local(common_name):
                record = await self._store.get(common_name)
                if record is not None:
                    self.place(common_name, record)
                    self._rejected.overwritten(common_name)
                    return record
        except StoreUnavailable as exc:
            log.debug("cert.lookup_from_memory cn=%s reason=%r", common_name, str(exc))
        return self._records.get(common_name)

    async def reload(self) -> Loaded:
        """Read every record again (at start, and on a resync): a name changed here while
        the store was read, or being changed now, keeps what this replica holds. Records
        refused are reported (each once)."""
        started = self._generation
        self._reloads += 1
        try:
            loaded = await self._store.load_all()
        finally:
            self._reloads -= 1
        found = {r.common_name: r for r in loaded.records}
        for name in found:
            self._rejected.overwritten(name)
        for rejected in loaded.rejected:
            if rejected.field not in self._rejected:
                self._rejected.add(rejected)
        for name in set(found) | set(self._records):
            if self._placed.get(name, 0) > started or name in self._locks:
                continue
            if found.get(name) != self._records.get(name):
                self.place(name, found.get(name))
        if not self._reloads:
            self._placed.clear()
        return loaded
