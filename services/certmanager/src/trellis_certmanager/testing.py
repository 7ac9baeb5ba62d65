"""Fakes for tests of code that uses the certmanager's seams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

from cryptography.hazmat.primitives.asymmetric import ec

from trellis_certmanager.claims import Claim
from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.csr import PublicKey
from trellis_certmanager.domain.errors import Deposed, StoreUnavailable
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.domain.revocation import Revocation
from trellis_certmanager.store import Loaded, LoadedRevocations
from trellis_runtime.stored import Rejected


class InMemoryCertificateStore:
    """A :class:`~trellis_certmanager.store.CertificateStore` in a dict.

    ``rejected`` are records ``load_all`` reports as refused, as a Redis holding corrupt
    ones would; writing or deleting the same common name removes them. ``down`` makes writes
    fail as they do while Redis is unavailable. Claims are held in this process only;
    the rotation fence is checked as in Redis (``fence``).
    """

    def __init__(self) -> None:
        self.ca: CertificateAuthority | None = None
        self.records: dict[str, CertificateRecord] = {}
        self.rejected: list[Rejected] = []
        self.revoked: dict[int, Revocation] = {}
        self.down = False
        self.fence = 0
        self.asks: dict[str, float] = {}
        self._held: dict[str, asyncio.Lock] = {}

    def _check(self, claim: Claim | None = None) -> None:
        if self.down:
            raise StoreUnavailable("the certificate store (Redis) did not take the write")
        if claim is not None and claim.fence is not None and claim.fence < self.fence:
            raise Deposed(f"a newer rotation leader (token {self.fence}) took over")

    @contextlib.asynccontextmanager
    async def hold(self, common_name: str, fence: int | None = None) -> AsyncIterator[Claim]:
        async with self._held.setdefault(common_name, asyncio.Lock()):
            yield Claim(common_name, "", fence)

    async def take_fence(self, token: int) -> None:
        self._check(Claim(fence=token))
        self.fence = token

    async def get(self, common_name: str) -> CertificateRecord | None:
        return self.records.get(common_name)

    async def load_ca(self) -> CertificateAuthority | None:
        return self.ca

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        if self.ca is None:
            self.ca = ca
        return self.ca

    async def replace_ca(self, ca: CertificateAuthority) -> None:
        self.ca = ca

    async def seal_ca(self, ca: CertificateAuthority) -> bool:
        return False  # nothing here is ever in the clear at rest

    async def put(self, record: CertificateRecord, claim: Claim | None = None) -> None:
        self._check(claim)
        await self.put_many([record])

    async def put_many(self, records: list[CertificateRecord]) -> None:
        self._check()
        for record in records:
            self.records[record.common_name] = record
        self._forget({r.common_name for r in records})

    async def delete_many(self, common_names: Sequence[str], claim: Claim | None = None) -> None:
        self._check(claim)
        for common_name in common_names:
            self.records.pop(common_name, None)
            self.asks.pop(common_name, None)
        self._forget(set(common_names))

    def _forget(self, common_names: set[str]) -> None:
        self.rejected = [r for r in self.rejected if r.field not in common_names]

    async def load_all(self) -> Loaded:
        return Loaded(list(self.records.values()), list(self.rejected))

    async def put_revoked(self, revocation: Revocation, claim: Claim | None = None) -> None:
        self._check(claim)
        self.revoked[revocation.serial] = revocation

    async def delete_revoked(self, serials: Sequence[int], claim: Claim | None = None) -> None:
        self._check(claim)
        for serial in serials:
            self.revoked.pop(serial, None)

    async def share_asks(self, asks: dict[str, float]) -> None:
        self._check()
        self.asks |= asks

    async def load_asks(self) -> dict[str, float]:
        return dict(self.asks)

    async def load_revoked(self) -> LoadedRevocations:
        return LoadedRevocations(list(self.revoked.values()), [])


def proxy_key() -> PublicKey:
    """The public half of a key a proxy made on its own host, as its CSR would carry it (a
    proxy certificate is signed for it; the private half is not needed by these tests)."""
    return ec.generate_private_key(ec.SECP256R1()).public_key()


class Leadership:
    """A leadership decided by the test, with the shape of ``trellis_kube.leadership``'s
    (``leading``, a fencing ``token`` that grows with each acquisition, ``run``,
    ``wait_leading``, ``subscribe``): :meth:`acquire` and :meth:`lose` move it."""

    def __init__(self, name: str = "certmanager", identity: str = "certmanager-0") -> None:
        self.name = name
        self.identity = identity
        self._leading = False
        self._token = 0
        self._changed = asyncio.Event()
        self._callbacks: list[Callable[[bool], None]] = []

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def token(self) -> int:
        return self._token

    def acquire(self, token: int) -> None:
        """This replica leads from now on, with fencing ``token``."""
        self._leading, self._token = True, token
        self._tell()

    def _tell(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        for callback in self._callbacks:
            callback(self._leading)

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()

    async def wait_leading(self, stop: asyncio.Event) -> bool:
        while not self._leading and not stop.is_set():
            changed = asyncio.ensure_future(self._changed.wait())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            stopped.cancel()
        return self._leading

    def subscribe(self, callback: Callable[[bool], None]) -> None:
        self._callbacks.append(callback)
