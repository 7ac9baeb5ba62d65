"""A leaf certificate as one CA's template with a few fields filled in.

Every leaf one CA signs shares most of its bytes: the version, the signature algorithm, the
issuer's name and the extensions that do not vary (basicConstraints, keyUsage,
extendedKeyUsage, authorityKeyIdentifier). :class:`LeafTemplate` encodes them once, with
the same encoders ``x509.CertificateBuilder`` uses (``Name.public_bytes``,
``ExtensionType.public_bytes``), and per leaf encodes only what varies: the serial, the
validity, the subject (O=Trellis, OU, CN), the subject's public key and the
subjectAltName (DNS names, IP addresses, URIs such as the SPIFFE id). It then signs the
TBSCertificate with the CA's key and wraps it into the Certificate SEQUENCE (RFC 5280 4.1).

The bytes are the builder's, byte for byte, for the same inputs (the tests hold the two side
by side). What the builder refused is refused here too, with ``ValueError``: a serial that
is not positive or is wider than 159 bits, a common name outside 1 to 64 UTF-8 octets, a
validity that ends before it starts or starts before 1950, a name that is not ASCII. A CA
key of a kind other than ECDSA or RSA is refused when the template is made (:class:`CAError`),
never signed with an approximation.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Callable, Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtensionOID, NameOID, SignatureAlgorithmOID

from trellis_certmanager.domain import der
from trellis_certmanager.domain.csr import PublicKey
from trellis_certmanager.domain.errors import CAError

_VERSION_3 = der.tlv(0xA0, der.integer(2))  # [0] EXPLICIT Version v3
_EXTENSIONS = 0xA3  # [3] EXPLICIT Extensions
_DNS_NAME = 0x82  # GeneralName [2] IMPLICIT IA5String
_URI = 0x86  # GeneralName [6] IMPLICIT IA5String
_IP_ADDRESS = 0x87  # GeneralName [7] IMPLICIT OCTET STRING
_SUBJECT_ALT_NAME = der.oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME.dotted_string)
_ORGANIZATION = der.oid(NameOID.ORGANIZATION_NAME.dotted_string)
_UNIT = der.oid(NameOID.ORGANIZATIONAL_UNIT_NAME.dotted_string)
_COMMON_NAME = der.oid(NameOID.COMMON_NAME.dotted_string)
_MAX_COMMON_NAME = 64  # ub-common-name (RFC 5280 appendix A.1), which cryptography enforces
_MAX_SERIAL_BITS = 159  # 20 octets with the sign bit clear (RFC 5280 4.1.2.2)

_SPKI = serialization.PublicFormat.SubjectPublicKeyInfo


def _attribute(kind: bytes, value: str) -> bytes:
    """One RelativeDistinguishedName holding one attribute, its value a UTF8String."""
    return der.tlv(der.SET, der.sequence(kind, der.utf8_string(value)))


def _extension(ext: x509.Extension[x509.ExtensionType]) -> bytes:
    """An Extension (RFC 5280 4.1): its id, ``critical`` only when true (DER omits a
    DEFAULT), and its value's DER in an OCTET STRING."""
    critical = der.TRUE if ext.critical else b""
    return der.sequence(
        der.oid(ext.oid.dotted_string), critical, der.octet_string(ext.value.public_bytes())
    )


def _signer(
    key: CertificateIssuerPrivateKeyTypes,
) -> tuple[bytes, Callable[[bytes], bytes]]:
    """The AlgorithmIdentifier of SHA-256 with ``key``'s kind, and how to sign with it."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        ecdsa = ec.ECDSA(hashes.SHA256())
        identifier = der.sequence(der.oid(SignatureAlgorithmOID.ECDSA_WITH_SHA256.dotted_string))
        return identifier, lambda tbs: key.sign(tbs, ecdsa)
    if isinstance(key, rsa.RSAPrivateKey):
        pkcs1, sha256 = padding.PKCS1v15(), hashes.SHA256()
        identifier = der.sequence(
            der.oid(SignatureAlgorithmOID.RSA_WITH_SHA256.dotted_string), der.NULL
        )
        return identifier, lambda tbs: key.sign(tbs, pkcs1, sha256)
    raise CAError(f"the CA's {type(key).__name__} cannot sign leaves: use an ECDSA or RSA key")


class LeafTemplate:
    """The leaves one CA signs: what they share, encoded once (see the module)."""

    def __init__(
        self,
        issuer: x509.Name,
        key: CertificateIssuerPrivateKeyTypes,
        extensions: Sequence[x509.Extension[x509.ExtensionType]],
    ) -> None:
        """``issuer`` is the CA certificate's subject; ``extensions``, in order, are the
        ones every leaf carries before its subjectAltName."""
        self._algorithm, self._sign = _signer(key)
        self._issuer = issuer.public_bytes()
        self._organization = _attribute(_ORGANIZATION, "Trellis")
        self._fixed = b"".join(_extension(e) for e in extensions)
        if any(e.oid == ExtensionOID.SUBJECT_ALTERNATIVE_NAME for e in extensions):
            raise ValueError("the subjectAltName varies per leaf: it is not a fixed extension")

    def tbs(
        self,
        *,
        serial: int,
        not_before: dt.datetime,
        not_after: dt.datetime,
        unit: str,
        common_name: str,
        public_key: PublicKey,
        dns_names: Iterable[str],
        uris: Iterable[str],
    ) -> bytes:
        """The TBSCertificate DER of one leaf; ``dns_names`` may hold IP addresses, which
        become iPAddress names. With neither names nor URIs there is no subjectAltName."""
        if serial <= 0 or serial.bit_length() > _MAX_SERIAL_BITS:
            raise ValueError(f"serial must be positive and at most {_MAX_SERIAL_BITS} bits")
        start, end = der.utc(not_before), der.utc(not_after)
        if end < start:
            raise ValueError("the validity ends before it starts")
        cn = common_name.encode("utf-8")
        if not 1 <= len(cn) <= _MAX_COMMON_NAME:
            raise ValueError(f"common name of {len(cn)} UTF-8 octets: 1 to {_MAX_COMMON_NAME}")
        subject = der.sequence(
            self._organization,
            _attribute(_UNIT, unit),
            der.tlv(der.SET, der.sequence(_COMMON_NAME, der.tlv(der.UTF8_STRING, cn))),
        )
        extensions = self._fixed + _subject_alt_name(dns_names, uris)
        return der.sequence(
            _VERSION_3,
            der.integer(serial),
            self._algorithm,
            self._issuer,
            der.sequence(der.time(start), der.time(end)),
            subject,
            public_key.public_bytes(serialization.Encoding.DER, _SPKI),
            der.tlv(_EXTENSIONS, der.tlv(der.SEQUENCE, extensions)),
        )

    def sign(self, tbs: bytes) -> bytes:
        """The Certificate DER: ``tbs``, the algorithm and the CA's signature over ``tbs``."""
        return der.sequence(tbs, self._algorithm, der.bit_string(self._sign(tbs)))


def _general_name(name: str) -> bytes:
    """An iPAddress for a name that is an IP address, else a dNSName."""
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return der.ia5_string(_DNS_NAME, name)
    return der.tlv(_IP_ADDRESS, address.packed)


def _subject_alt_name(dns_names: Iterable[str], uris: Iterable[str]) -> bytes:
    """The subjectAltName extension (not critical), or nothing when it would be empty."""
    names = [_general_name(n) for n in dns_names]
    names += [der.ia5_string(_URI, u) for u in uris]
    if not names:
        return b""
    return der.sequence(_SUBJECT_ALT_NAME, der.octet_string(der.sequence(*names)))
