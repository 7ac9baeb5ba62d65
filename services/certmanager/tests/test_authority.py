"""The mesh CA: a generated root, and the operator's own CA with its checks."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from trellis_certmanager.domain.authority import (
    CertificateAuthority,
    generate_root,
    load_provided,
)
from trellis_certmanager.domain.errors import CAError
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm, key_to_pem
from trellis_common.model import MeshService

NOW = dt.datetime(2026, 11, 22, tzinfo=dt.UTC)


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(
    name: str,
    signer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    *,
    ca: bool = True,
    not_after: dt.datetime | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = (signer[0].subject, signer[1]) if signer else (subject, key)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(not_after or NOW + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .sign(issuer_key, hashes.SHA256())
    )
    return cert, key


@pytest.mark.parametrize(
    ("algorithm", "key_type"),
    [
        (KeyAlgorithm.ECDSA_P256, ec.EllipticCurvePublicKey),
        (KeyAlgorithm.RSA_2048, rsa.RSAPublicKey),
    ],
)
def test_generated_root_is_a_self_signed_ca(algorithm: KeyAlgorithm, key_type: type) -> None:
    ca = generate_root(algorithm, dt.timedelta(days=3650), NOW, "example.org")
    cert = ca.cert
    assert isinstance(cert.public_key(), key_type)
    if algorithm is KeyAlgorithm.RSA_2048:
        public = cert.public_key()
        assert isinstance(public, rsa.RSAPublicKey)
        assert public.key_size == 2048
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=3650)
    assert ca.roots == (cert,)
    assert ca.chain_pem == b""  # leaves carry nothing after themselves
    assert ca.origin == "generated"


def test_ca_round_trips_through_its_durable_form(root_ca: CertificateAuthority) -> None:
    again = CertificateAuthority.from_pems(root_ca.to_pems())
    assert again.fingerprint == root_ca.fingerprint
    assert again.key_pem == root_ca.key_pem
    assert "key=" not in repr(root_ca)


def test_stored_ca_that_is_garbage_is_a_clear_error() -> None:
    with pytest.raises(CAError, match="stored CA is unreadable"):
        CertificateAuthority.from_pems({"cert_pem": b"nope", "key_pem": b"", "roots_pem": b""})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("key_pem", b"-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n", ""),
        ("roots_pem", b"", "no root certificate"),
        ("cert_pem", None, "field 'cert_pem' is missing"),
    ],
)
def test_a_damaged_field_of_a_stored_ca_is_named(
    root_ca: CertificateAuthority, field: str, value: bytes | None, message: str
) -> None:
    pems = root_ca.to_pems()
    if value is None:
        del pems[field]
    else:
        pems[field] = value
    with pytest.raises(CAError, match=f"stored CA is unreadable: .*{message}"):
        CertificateAuthority.from_pems(pems)


def test_a_stored_ca_whose_key_is_another_ca_s_is_refused(root_ca: CertificateAuthority) -> None:
    other = generate_root(KeyAlgorithm.ECDSA_P256, dt.timedelta(days=1), NOW, "cluster.local")
    pems = {**root_ca.to_pems(), "key_pem": other.key_pem}
    with pytest.raises(CAError, match="key does not match its certificate"):
        CertificateAuthority.from_pems(pems)


def test_operator_root_is_used_as_is() -> None:
    cert, key = make_ca("Operator Root")
    ca = load_provided(pem(cert), key_to_pem(key), b"", NOW)
    assert ca.origin == "provided"
    assert ca.roots == (cert,)
    assert ca.intermediates == ()


def test_operator_intermediate_with_chain_issues_leaves_that_chain_to_the_root() -> None:
    root, root_key = make_ca("Operator Root")
    inter, inter_key = make_ca("Operator Intermediate", (root, root_key))
    ca = load_provided(pem(inter), key_to_pem(inter_key), pem(root), NOW)
    assert ca.roots == (root,)
    assert ca.chain_pem == pem(inter)
    leaf_record = Issuer(ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy()).issue_service(
        MeshService("shop", "cart"), "cart", NOW
    )
    chain = x509.load_pem_x509_certificates(leaf_record.cert_chain_pem)
    assert len(chain) == 2
    chain[0].verify_directly_issued_by(inter)
    chain[1].verify_directly_issued_by(root)
    assert ca.trust_bundle_pem == pem(root)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("key-mismatch", "does not match"),
        ("not-a-ca", "not a CA"),
        ("broken-chain", "chain broken"),
        ("no-root", "no root"),
        ("expired", "expired"),
        ("garbage-cert", "not PEM|no certificate"),
        ("garbage-key", "not an unencrypted PEM private key"),
    ],
)
def test_operator_ca_problems_are_named(case: str, message: str) -> None:
    root, root_key = make_ca("Root")
    other_root, other_key = make_ca("Other Root")
    inter, inter_key = make_ca("Intermediate", (root, root_key))
    cert_pem, key_pem, chain_pem = pem(root), key_to_pem(root_key), b""
    if case == "key-mismatch":
        key_pem = key_to_pem(other_key)
    elif case == "not-a-ca":
        leaf, leaf_key = make_ca("Leaf", (root, root_key), ca=False)
        cert_pem, key_pem = pem(leaf), key_to_pem(leaf_key)
    elif case == "broken-chain":
        cert_pem, key_pem, chain_pem = pem(inter), key_to_pem(inter_key), pem(other_root)
    elif case == "no-root":
        cert_pem, key_pem = pem(inter), key_to_pem(inter_key)
    elif case == "expired":
        old, old_key = make_ca("Old", not_after=NOW - dt.timedelta(hours=1))
        cert_pem, key_pem = pem(old), key_to_pem(old_key)
    elif case == "garbage-cert":
        cert_pem = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    elif case == "garbage-key":
        key_pem = b"not a key"
    with pytest.raises(CAError, match=message):
        load_provided(cert_pem, key_pem, chain_pem, NOW)
