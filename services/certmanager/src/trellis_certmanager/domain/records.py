"""What certmanager keeps per certificate: metadata, the PEM chain, and (service
certificates only) the key.

A :class:`CertificateRecord` is the durable unit (JSON in the store, its key sealed by the
function the store passes in). The key is held with ``repr=False`` and left out of
:meth:`CertificateRecord.metadata`, the only form that goes to listings, REST answers,
events and logs.

Proxy certificates are issued for a CSR: the proxy made its key on its own host, so their
records have no key (``key_pem == b""``) and their durable form has no key field at all.
Records written before that, with a proxy's key, still load (the key is checked against the
certificate like any other); :func:`without_proxy_key` is how the store then drops the key.

A record read back from the store is not trusted: :func:`check` holds it to what the issuer
would have produced (identities that validate, a certificate that parses and is the one the
metadata describes, a key that matches it, which every service record has), so a record
written by an older version, or damaged at rest, is refused at load instead of being
served or breaking a loop later.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from trellis_certmanager.domain.sealed import SealError
from trellis_common.ids import (
    InvalidIdentifier,
    ProxyCommonName,
    validate_dns_label,
    validate_dns_subdomain,
)


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

    def to_json(self, seal: Callable[[bytes], str]) -> str:
        """The durable form: metadata, the chain, and the key as ``seal`` makes it
        (:mod:`~trellis_certmanager.domain.sealed`); only the store sees it. A record
        without a key (a proxy's) has no key field."""
        body = self.metadata()
        body["cert_chain_pem"] = self.cert_chain_pem.decode()
        if self.key_pem:
            body[SEALED_KEY_FIELD] = seal(self.key_pem)
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes, unseal: Callable[[str], bytes]) -> CertificateRecord:
        """The record of a durable form; its key goes through ``unseal`` (whose
        ``ValueError`` says why it cannot), or is read as it is from a record an older
        version wrote in the clear (:func:`in_the_clear`)."""
        return cls.from_body(parse_body(text), unseal)

    @classmethod
    def from_body(cls, body: dict[str, Any], unseal: Callable[[str], bytes]) -> CertificateRecord:
        try:
            if LEGACY_KEY_FIELD in body:
                key_pem = body[LEGACY_KEY_FIELD].encode()
            elif SEALED_KEY_FIELD in body or body.get("kind") != CertificateKind.PROXY:
                key_pem = unseal(body[SEALED_KEY_FIELD])
            else:  # a proxy certificate issued for a CSR: certmanager never had the key
                key_pem = b""
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
                key_pem=key_pem,
            )
        except SealError as exc:
            raise ValueError(f"the key cannot be unsealed: {exc}") from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed certificate record: {exc!r}") from exc


#: The field of the durable form that holds the sealed key.
SEALED_KEY_FIELD = "key_sealed"
#: The field in which versions before sealing kept the key in the clear.
LEGACY_KEY_FIELD = "key_pem"


def parse_body(text: str | bytes) -> dict[str, Any]:
    """The JSON object of a durable form; ``ValueError`` if it is not one."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"malformed certificate record: {exc!r}") from exc
    if not isinstance(body, dict):
        raise ValueError(f"malformed certificate record: a JSON {type(body).__name__}")
    return body


def in_the_clear(body: dict[str, Any]) -> bool:
    """Whether a durable form holds its key in the clear (written before sealing)."""
    return LEGACY_KEY_FIELD in body


def without_proxy_key(record: CertificateRecord) -> CertificateRecord | None:
    """A proxy record written before issuance by CSR, with its key dropped; ``None`` for
    any other record. certmanager has no use for a proxy's key (rotation re-signs the
    certificate's public key), so the store writes such a record back without it."""
    if record.kind is CertificateKind.PROXY and record.key_pem:
        return replace(record, key_pem=b"")
    return None


def past_expiry(
    records: Iterable[CertificateRecord], now: dt.datetime, grace: dt.timedelta
) -> list[str]:
    """The common names of records that expired more than ``grace`` ago, sorted."""
    return sorted(r.common_name for r in records if r.not_after + grace <= now)


class InvalidRecord(ValueError):
    """A stored record is not one the issuer would have made; the message says why."""


def check(record: CertificateRecord) -> CertificateRecord:
    """Return ``record`` if it is sound, else raise :class:`InvalidRecord` naming the fault."""
    try:
        validate_dns_label(record.namespace, "namespace")
        validate_dns_label(record.service, "service name")
        validate_dns_subdomain(record.service_account, "service account")
        if record.kind is CertificateKind.PROXY:
            cn = ProxyCommonName.parse(record.common_name)
            if (cn.proxy_id, cn.service, cn.namespace) != (
                record.proxy_id,
                record.service,
                record.namespace,
            ):
                raise InvalidRecord(
                    f"common name {record.common_name!r} does not match proxy_id, service "
                    "and namespace"
                )
        elif not record.common_name.startswith(f"{record.service}.{record.namespace}.svc."):
            raise InvalidRecord(
                f"common name {record.common_name!r} is not the service certificate of "
                f"{record.namespace}/{record.service}"
            )
    except InvalidIdentifier as exc:
        raise InvalidRecord(str(exc)) from exc
    for name in ("not_before", "not_after", "renew_after"):
        if getattr(record, name).tzinfo is None:
            raise InvalidRecord(f"{name} has no time zone")
    try:
        leaf = x509.load_pem_x509_certificate(record.cert_chain_pem)
    except ValueError as exc:
        raise InvalidRecord(f"cert_chain_pem is not a PEM certificate: {exc}") from exc
    subject = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [a.value for a in subject] != [record.common_name] or leaf.serial_number != record.serial:
        raise InvalidRecord("cert_chain_pem holds another certificate than the record describes")
    if not record.key_pem:
        if record.kind is CertificateKind.PROXY:
            return record  # issued for a CSR: the key is on the proxy's host only
        raise InvalidRecord("key_pem is empty: a service certificate's key is kept")
    try:
        key = serialization.load_pem_private_key(record.key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise InvalidRecord(f"key_pem is not an unencrypted PEM private key: {exc}") from exc
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(
        serialization.Encoding.DER, spki
    ) != leaf.public_key().public_bytes(serialization.Encoding.DER, spki):
        raise InvalidRecord("key_pem does not match the certificate")
    return record
