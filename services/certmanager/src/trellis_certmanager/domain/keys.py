"""Private keys: ECDSA P-256 (the default) or RSA-2048, and their PEM forms."""

from __future__ import annotations

import enum

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import (
    CertificateIssuerPrivateKeyTypes,
    PrivateKeyTypes,
)


class KeyAlgorithm(enum.StrEnum):
    ECDSA_P256 = "ecdsa-p256"
    RSA_2048 = "rsa-2048"


SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def generate_key(algorithm: KeyAlgorithm) -> SigningKey:
    if algorithm is KeyAlgorithm.RSA_2048:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: PrivateKeyTypes) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def key_from_pem(pem: bytes) -> CertificateIssuerPrivateKeyTypes:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise ValueError(f"unsupported CA key type {type(key).__name__}: use ECDSA or RSA")
    return key
