"""A CSR is taken for its public key only when its signature verifies and the key is allowed."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from trellis_certmanager.domain.csr import public_key_from_csr
from trellis_certmanager.domain.errors import InvalidRequest


def make_csr(
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey,
) -> bytes:
    builder = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "anything")])
    )
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM)


def test_the_public_key_of_a_good_request_is_returned() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    got = public_key_from_csr(make_csr(key))
    assert got.public_numbers() == key.public_key().public_numbers()


@pytest.mark.parametrize(
    ("pem", "words"),
    [
        (b"", "is required"),
        (
            b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
            "not a PEM",
        ),
        (b"x" * 20_000, "longer than"),
    ],
)
def test_what_is_not_a_request_is_refused_by_name(pem: bytes, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words) as caught:
        public_key_from_csr(pem, field="csr")
    assert caught.value.field == "csr"


def test_a_request_whose_signature_does_not_verify_is_refused() -> None:
    good = x509.load_pem_x509_csr(make_csr(ec.generate_private_key(ec.SECP256R1())))
    der = bytearray(good.public_bytes(serialization.Encoding.DER))
    der[-3] ^= 0x01  # inside the signature
    forged = x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(InvalidRequest, match="signature does not verify"):
        public_key_from_csr(forged)


@pytest.mark.parametrize(
    ("key", "words"),
    [
        (ec.generate_private_key(ec.SECP256K1()), "curve secp256k1 is not allowed"),
        (rsa.generate_private_key(public_exponent=65537, key_size=1024), "1024 bits"),
        (ed25519.Ed25519PrivateKey.generate(), "Ed25519PublicKey keys are not allowed"),
    ],
)
def test_keys_the_mesh_does_not_use_are_refused(
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey, words: str
) -> None:
    with pytest.raises(InvalidRequest, match=words):
        public_key_from_csr(make_csr(key))
