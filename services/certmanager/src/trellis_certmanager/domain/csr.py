"""Certificate signing requests: the requester makes its key and proves it holds it.

Issuance from a CSR is how keys never travel: a component, ``trellis vm bootstrap`` or the
injector generates its private key where it will be used and sends only a PKCS#10 request.
certmanager takes the public key from it, after checking the request's signature (proof
that the sender holds the private key) and that the key is of a kind the mesh uses. Nothing
else in the request is trusted: the subject, the SANs and the extensions of the
certificate are certmanager's to decide from the identity the caller is authorized for.
"""

from __future__ import annotations

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from trellis_certmanager.domain.errors import InvalidRequest

#: The curves and sizes a requester's key may have (what Envoy and grpc accept).
CURVES = (ec.SECP256R1, ec.SECP384R1)
MIN_RSA_BITS = 2048
MAX_CSR_BYTES = 16 * 1024

PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


def public_key_from_csr(pem: bytes, field: str = "csr_pem") -> PublicKey:
    """The public key of a PEM CSR whose signature verifies; :class:`InvalidRequest`
    naming ``field`` and what is wrong otherwise."""
    if not pem:
        raise InvalidRequest(field, "a PEM certificate signing request is required")
    if len(pem) > MAX_CSR_BYTES:
        raise InvalidRequest(field, f"longer than {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(pem)
    except ValueError as exc:
        raise InvalidRequest(field, f"not a PEM certificate signing request ({exc})") from None
    if not csr.is_signature_valid:
        raise InvalidRequest(field, "the request's signature does not verify")
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, CURVES):
            raise InvalidRequest(field, f"curve {key.curve.name} is not allowed: use P-256")
        return key
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise InvalidRequest(field, f"RSA key of {key.key_size} bits: at least 2048")
        return key
    raise InvalidRequest(field, f"{type(key).__name__} keys are not allowed: use ECDSA P-256")


def leaf_public_key(cert_chain_pem: bytes) -> PublicKey:
    """The public key of a chain's leaf: what a proxy certificate is re-signed for on
    rotation (the proxy keeps its key). ``ValueError`` for a key type the mesh does not use."""
    key = x509.load_pem_x509_certificate(cert_chain_pem).public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise ValueError(f"the certificate's {type(key).__name__} is not ECDSA or RSA")
    return key


def same_key(first: PublicKey, second: PublicKey) -> bool:
    """Whether two public keys are the same key (their SubjectPublicKeyInfo DER)."""
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return first.public_bytes(der, spki) == second.public_bytes(der, spki)


def signed_for(cert_chain_pem: bytes, public_key: PublicKey) -> bool:
    """Whether the chain's leaf certifies ``public_key``."""
    return same_key(leaf_public_key(cert_chain_pem), public_key)
