"""Fakes for tests of code that uses the certmanager's seams."""

from __future__ import annotations

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.records import CertificateRecord


class InMemoryCertificateStore:
    """A :class:`~trellis_certmanager.store.CertificateStore` in a dict."""

    def __init__(self) -> None:
        self.ca: CertificateAuthority | None = None
        self.records: dict[str, CertificateRecord] = {}

    async def load_ca(self) -> CertificateAuthority | None:
        return self.ca

    async def save_ca_if_absent(self, ca: CertificateAuthority) -> CertificateAuthority:
        if self.ca is None:
            self.ca = ca
        return self.ca

    async def replace_ca(self, ca: CertificateAuthority) -> None:
        self.ca = ca

    async def put(self, record: CertificateRecord) -> None:
        self.records[record.common_name] = record

    async def put_many(self, records: list[CertificateRecord]) -> None:
        for record in records:
            self.records[record.common_name] = record

    async def load_all(self) -> list[CertificateRecord]:
        return list(self.records.values())
