"""The proxy certificate serials certmanager revoked, as proxy-cp knows them.

certmanager owns the revoked set (``ListRevokedCertificates``); proxy-cp keeps a copy, read
in full on every resync of the ``certificates`` topic and per common name when a ``revoked``
signal names one. The authorizer refuses a stream presenting a serial in it, whatever the
catalog's (possibly older) listing says; the certificate follower ends the open streams of
a serial once it is added. An entry goes when certmanager prunes it (the certificate has
expired, so the TLS handshake refuses it anyway).
"""

from __future__ import annotations

from collections.abc import Iterable


class RevokedSerials:
    """Revoked serial (lowercase hex) -> the common name it was issued to."""

    def __init__(self) -> None:
        self._by_serial: dict[str, str] = {}

    def replace_all(self, revoked: Iterable[tuple[str, str]]) -> None:
        """certmanager's full list of ``(serial, common name)``."""
        self._by_serial = dict(revoked)

    def add(self, common_name: str, serials: Iterable[str]) -> set[str]:
        """Revoked serials of ``common_name``; returns those that were not known yet."""
        new = {s for s in serials if s not in self._by_serial}
        self._by_serial.update((s, common_name) for s in new)
        return new

    def of(self, common_name: str) -> set[str]:
        return {s for s, name in self._by_serial.items() if name == common_name}

    def __contains__(self, serial: object) -> bool:
        return serial in self._by_serial

    def __len__(self) -> int:
        return len(self._by_serial)
