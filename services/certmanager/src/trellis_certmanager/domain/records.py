"""What certmanager keeps per certificate: metadata, the PEM chain, and the key.

A :class:`CertificateRecord` is the durable unit (JSON in the store). The key is held
with ``repr=False`` and left out of :meth:`CertificateRecord.metadata`, the only form that
goes to listings, REST answers, events and logs.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from dataclasses import dataclass, field
from typing import Any


class CertificateKind(enum.StrEnum):
    SERVICE = "service"
    PROXY = "proxy"


@dataclass(frozen=True, slots=True)
class CertificateRecord:
    common_name: str
    kind: CertificateKind
    serial: int
    not_before: dt.datetime
    not_after: dt.datetime
    renew_after: dt.datetime
    namespace: str
    service: str
    service_account: str
    proxy_id: str
    dns_names: tuple[str, ...]
    uris: tuple[str, ...]
    issuer: str
    fingerprint: str
    cert_chain_pem: bytes = field(repr=False)
    key_pem: bytes = field(repr=False)

    @property
    def lifetime(self) -> dt.timedelta:
        return self.not_after - self.not_before

    def due(self, now: dt.datetime) -> bool:
        """Time to rotate: past the renewal point (or already expired)."""
        return now >= self.renew_after

    def metadata(self) -> dict[str, Any]:
        """Everything but the key, JSON-ready: for listings, REST and logs."""
        return {
            "common_name": self.common_name,
            "kind": self.kind.value,
            "serial": f"{self.serial:x}",
            "not_before": self.not_before.isoformat(),
            "not_after": self.not_after.isoformat(),
            "renew_after": self.renew_after.isoformat(),
            "namespace": self.namespace,
            "service": self.service,
            "service_account": self.service_account,
            "proxy_id": self.proxy_id,
            "dns_names": list(self.dns_names),
            "uris": list(self.uris),
            "issuer": self.issuer,
            "fingerprint_sha256": self.fingerprint,
        }

    def to_json(self) -> str:
        """The durable form, key included: only the store sees it."""
        body = self.metadata()
        body["cert_chain_pem"] = self.cert_chain_pem.decode()
        body["key_pem"] = self.key_pem.decode()
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> CertificateRecord:
        try:
            body = json.loads(text)
            return cls(
                common_name=body["common_name"],
                kind=CertificateKind(body["kind"]),
                serial=int(body["serial"], 16),
                not_before=dt.datetime.fromisoformat(body["not_before"]),
                not_after=dt.datetime.fromisoformat(body["not_after"]),
                renew_after=dt.datetime.fromisoformat(body["renew_after"]),
                namespace=body["namespace"],
                service=body["service"],
                service_account=body["service_account"],
                proxy_id=body["proxy_id"],
                dns_names=tuple(body["dns_names"]),
                uris=tuple(body["uris"]),
                issuer=body["issuer"],
                fingerprint=body["fingerprint_sha256"],
                cert_chain_pem=body["cert_chain_pem"].encode(),
                key_pem=body["key_pem"].encode(),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed certificate record: {exc!r}") from exc
