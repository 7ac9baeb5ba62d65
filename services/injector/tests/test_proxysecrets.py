"""When an injected proxy's certificate is renewed (the rest: tests/integration/test_webhook.py)."""

from __future__ import annotations

import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_injector.proxysecrets import renewal_due

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def certificate(hours: int) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "p.bookbuyer.bookbuyer")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(START)
        .not_valid_after(START + dt.timedelta(hours=hours))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def test_a_certificate_is_due_once_the_fraction_of_its_life_has_passed() -> None:
    cert_pem = certificate(24)
    assert not renewal_due(cert_pem, 2 / 3, START)
    assert not renewal_due(cert_pem, 2 / 3, START + dt.timedelta(hours=15, minutes=59))
    assert renewal_due(cert_pem, 2 / 3, START + dt.timedelta(hours=16))
    assert renewal_due(cert_pem, 2 / 3, START + dt.timedelta(hours=30))  # expired: renew too
