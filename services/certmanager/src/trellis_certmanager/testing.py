"""Fakes for tests of code that uses the certmanager's seams."""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric import ec

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.csr import PublicKey
from trellis_certmanager.domain.errors import StoreUnavailable
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.domain.revocation import Revocation
from trellis_certmanager.store import Loaded, LoadedRevocations
from trellis_common.stored import Rejected


class InMemoryCertificateStore:
    """A :class:`~trellis_certmanager.store.CertificateStore` in a dict.

    ``rejected`` are records ``load_all`` reports as refused, as a Redis holding corrupt
    ones would; writing or deleting the same common name removes them. ``down`` makes writes
    fail as they do while Redis is unavailable.
    """

    def __init__(self) -> None:
        self.ca: CertificateAuthority | None = None
        self.records: dict[str, CertificateRecord] = {}
        self.rejected: list[Rejected] = []
        self.revoked: dict[int, Revocation] = {}
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise StoreUnavailable("the certificate store (Redis) did not take the write")

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

    async def put(self, record: CertificateRecord) -> None:
        await self.put_many([record])

    async def put_many(self, records: list[CertificateRecord]) -> None:
        self._check()
        for record in records:
            self.records[record.common_name] = record
        self._forget({r.common_name for r in records})

    async def delete_many(self, common_names: Sequence[str]) -> None:
        self._check()
        for common_name in common_names:
            self.records.pop(common_name, None)
        self._forget(set(common_names))

    def _forget(self, common_names: set[str]) -> None:
        self.rejected = [r for r in self.rejected if r.field not in common_names]

    async def load_all(self) -> Loaded:
        return Loaded(list(self.records.values()), list(self.rejected))

    async def put_revoked(self, revocation: Revocation) -> None:
        self._check()
        self.revoked[revocation.serial] = revocation

    async def delete_revoked(self, serials: Sequence[int]) -> None:
        self._check()
        for serial in serials:
            self.revoked.pop(serial, None)

    async def load_revoked(self) -> LoadedRevocations:
        return LoadedRevocations(list(self.revoked.values()), [])


def proxy_key() -> PublicKey:
    """The public half of a key a proxy made on its own host, as its CSR would carry it (a
    proxy certificate is signed for it; the private half is not needed by these tests)."""
    return ec.generate_private_key(ec.SECP256R1()).public_key()
