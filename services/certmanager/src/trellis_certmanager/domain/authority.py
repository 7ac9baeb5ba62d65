"""The mesh certificate authority: a root Trellis makes, or the operator's own CA.

A self-made root is ECDSA P-256 (RSA-2048 on request), valid ten years, and signs leaves
directly. An operator's CA may be a root or an intermediate: the certificate that signs,
its key, and optionally the chain up to a root. Leaves then carry the intermediates, and
the trust bundle proxies verify against is the root(s). Loading checks what a bad file
would otherwise break much later: the key matches the certificate, the certificate may sign
certificates, the chain links up and nothing is expired.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PublicKeyTypes,
)
from cryptography.x509.oid import NameOID

from trellis_certmanager.domain.errors import CAError
from trellis_certmanager.domain.keys import KeyAlgorithm, generate_key, key_from_pem, key_to_pem

ROOT_COMMON_NAME = "Trellis Mesh Root CA"
ORGANIZATION = "Trellis"


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    """The signing certificate and key, the intermediates above it, and the trust bundle."""

    cert: x509.Certificate
    key: CertificateIssuerPrivateKeyTypes = field(repr=False)
    intermediates: tuple[x509.Certificate, ...]
    roots: tuple[x509.Certificate, ...]
    origin: str  # "generated" or "provided"

    def signed(self, cert_chain_pem: bytes) -> bool:
        """Whether the chain's leaf was signed by this CA (an operator may change CAs)."""
        leaf = x509.load_pem_x509_certificate(cert_chain_pem)
        try:
            leaf.verify_directly_issued_by(self.cert)
        except (InvalidSignature, ValueError, TypeError):
            return False
        return True

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return key_to_pem(self.key)

    @property
    def chain_pem(self) -> bytes:
        """What a leaf carries after itself: the signer unless it is a root, and above it."""
        certs = [] if _self_signed(self.cert) else [self.cert]
        certs += self.intermediates
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)

    @property
    def trust_bundle_pem(self) -> bytes:
        return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in self.roots)

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the (first) root's DER: the identity of the mesh's trust."""
        return fingerprint(self.roots[0])

    def to_pems(self) -> dict[str, bytes]:
        """The durable form (stored by the store; never sent over an API)."""
        return {
            "cert_pem": self.cert_pem,
            "key_pem": self.key_pem,
            "intermediates_pem": b"".join(
                c.public_bytes(serialization.Encoding.PEM) for c in self.intermediates
            ),
            "roots_pem": self.trust_bundle_pem,
            "origin": self.origin.encode(),
        }

    @classmethod
    def from_pems(cls, pems: dict[str, bytes]) -> CertificateAuthority:
        try:
            ca = cls(
                cert=x509.load_pem_x509_certificate(pems["cert_pem"]),
                key=key_from_pem(pems["key_pem"]),
                intermediates=tuple(_load_many(pems.get("intermediates_pem", b""))),
                roots=tuple(_load_many(pems["roots_pem"])),
                origin=pems.get("origin", b"generated").decode(),
            )
        except KeyError as exc:
            raise CAError(f"stored CA is unreadable: field {exc.args[0]!r} is missing") from exc
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise CAError(f"stored CA is unreadable: {exc}") from exc
        if not ca.roots:
            raise CAError("stored CA is unreadable: it has no root certificate")
        if _public_der(ca.cert.public_key()) != _public_der(ca.key.public_key()):
            raise CAError("stored CA is unreadable: its key does not match its certificate")
        _check_chain(ca)
        return ca


def _check_chain(ca: CertificateAuthority) -> None:
    """The signer chains up to the first root: a stored CA that only *names* this mesh's
    root (same roots, another signer) is not this mesh's CA."""
    chain = [ca.cert, *ca.intermediates]
    try:
        for child, parent in itertools.pairwise(chain):
            _verify_signed_by(child, parent)
        top = chain[-1]
        if _self_signed(top):
            if top != ca.roots[0]:
                raise CAError(f"{top.subject.rfc4514_string()} is not the CA's root")
        else:
            _verify_signed_by(top, ca.roots[0])
    except CAError as exc:
        raise CAError(
            f"stored CA is unreadable: its signer does not chain to its root ({exc})"
        ) from exc


def _public_der(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def fingerprint(cert: x509.Certificate) -> str:
    return fingerprint_der(cert.public_bytes(serialization.Encoding.DER))


def fingerprint_der(cert_der: bytes) -> str:
    """SHA-256 of a certificate's DER, in hex: how records and the CA name certificates."""
    return hashlib.sha256(cert_der).hexdigest()


def _self_signed(cert: x509.Certificate) -> bool:
    return cert.issuer == cert.subject


def _load_many(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem) if pem.strip() else []


def generate_root(
    algorithm: KeyAlgorithm, validity: dt.timedelta, now: dt.datetime, trust_domain: str
) -> CertificateAuthority:
    """A new self-signed root that signs leaves directly."""
    key = generate_key(algorithm)
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, trust_domain),
            x509.NameAttribute(NameOID.COMMON_NAME, ROOT_COMMON_NAME),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(cert, key, (), (cert,), "generated")


def load_provided(
    cert_pem: bytes, key_pem: bytes, chain_pem: bytes, now: dt.datetime
) -> CertificateAuthority:
    """The operator's CA; ``cert_pem`` may itself hold the chain after the signer.

    A certificate given twice counts once: a Kubernetes TLS Secret of a root has it in both
    ``tls.crt`` and ``ca.crt``."""
    try:
        loaded = _load_many(cert_pem) + _load_many(chain_pem)
    except ValueError as exc:
        raise CAError(f"CA certificate file is not PEM: {exc}") from exc
    certs = list({c.fingerprint(hashes.SHA256()): c for c in loaded}.values())
    if not certs:
        raise CAError("CA certificate file holds no certificate")
    try:
        key = key_from_pem(key_pem)
    except (ValueError, TypeError) as exc:
        raise CAError(f"CA key file is not an unencrypted PEM private key: {exc}") from exc
    signer, above = certs[0], certs[1:]
    if signer.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CAError("CA key does not match the CA certificate")
    try:
        constraints = signer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        raise CAError("CA certificate has no basicConstraints: it cannot sign") from None
    if not constraints.ca:
        raise CAError("CA certificate is not a CA (basicConstraints CA:FALSE)")
    for cert in certs:
        if cert.not_valid_after_utc <= now:
            raise CAError(f"certificate {cert.subject.rfc4514_string()} expired")
    for child, parent in itertools.pairwise(certs):
        _verify_signed_by(child, parent)
    roots = [c for c in certs if _self_signed(c)]
    intermediates = tuple(c for c in above if not _self_signed(c))
    if not roots:
        raise CAError(
            "no root in the CA files: give the chain up to a self-signed root "
            "(ca bundle file) so proxies know what to trust"
        )
    return CertificateAuthority(signer, key, intermediates, tuple(roots), "provided")


def _verify_signed_by(child: x509.Certificate, parent: x509.Certificate) -> None:
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise CAError(
            f"chain broken: {child.subject.rfc4514_string()} is not signed by "
            f"{parent.subject.rfc4514_string()}"
        ) from exc
