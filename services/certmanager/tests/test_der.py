"""The DER encoders, against X.690's rules and against cryptography's own encodings."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography.hazmat.primitives import serialization

from trellis_certmanager.domain import der
from trellis_certmanager.domain.authority import CertificateAuthority


@pytest.mark.parametrize(
    ("size", "header"),
    [
        (0, b"\x04\x00"),
        (0x7F, b"\x04\x7f"),  # the longest short form
        (0x80, b"\x04\x81\x80"),  # the shortest long form
        (0xFF, b"\x04\x81\xff"),
        (0x100, b"\x04\x82\x01\x00"),
        (0xFFFF, b"\x04\x82\xff\xff"),
        (0x10000, b"\x04\x83\x01\x00\x00"),
    ],
)
def test_lengths_take_the_fewest_octets(size: int, header: bytes) -> None:
    body = bytes(size)
    assert der.octet_string(body) == header + body


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "020100"),
        (1, "020101"),
        (0x7F, "02017f"),
        (0x80, "02020080"),  # high bit set: a zero octet keeps it positive
        (0xFF, "020200ff"),
        (0x100, "02020100"),
        (0x8000, "0203008000"),
        ((1 << 159) - 1, "0214" + "7f" + "ff" * 19),  # the widest serial: 20 octets
        (1 << 151, "0214" + "0080" + "00" * 18),  # high bit set: 19 octets and a zero
    ],
)
def test_integers_are_minimal_and_positive(value: int, encoded: str) -> None:
    assert der.integer(value).hex() == encoded


def test_negative_integers_are_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        der.integer(-1)


@pytest.mark.parametrize(
    ("dotted", "encoded"),
    [
        ("2.5.4.3", "0603550403"),
        ("1.2.840.10045.4.3.2", "06082a8648ce3d040302"),
        ("1.2.840.113549.1.1.11", "06092a864886f70d01010b"),
        ("2.5.29.17", "0603551d11"),
        ("2.999.3", "0603883703"),  # first arcs beyond one octet
    ],
)
def test_object_identifiers(dotted: str, encoded: str) -> None:
    assert der.oid(dotted).hex() == encoded


@pytest.mark.parametrize("dotted", ["1", "3.1", "1.40", "0.45.1"])
def test_malformed_object_identifiers_are_refused(dotted: str) -> None:
    with pytest.raises(ValueError, match="not an object identifier"):
        der.oid(dotted)


UTC = dt.UTC


@pytest.mark.parametrize(
    ("moment", "encoded"),
    [
        (dt.datetime(1950, 1, 1, tzinfo=UTC), b"\x17\x0d500101000000Z"),
        (dt.datetime(2026, 11, 22, 12, 0, 5, 999999, tzinfo=UTC), b"\x17\x0d261122120005Z"),
        (dt.datetime(2049, 12, 31, 23, 59, 59, tzinfo=UTC), b"\x17\x0d491231235959Z"),
        (dt.datetime(2050, 1, 1, tzinfo=UTC), b"\x18\x0f20500101000000Z"),
        (dt.datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC), b"\x18\x0f99991231235959Z"),
        # another zone is converted to UTC; a naive time is UTC already
        (
            dt.datetime(2050, 1, 1, 5, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
            b"\x18\x0f20500101000000Z",
        ),
        (dt.datetime(2049, 12, 31, 23, 59, 59), b"\x17\x0d491231235959Z"),
    ],
)
def test_times_follow_rfc_5280(moment: dt.datetime, encoded: bytes) -> None:
    assert der.time(moment) == encoded


def test_times_before_1950_are_refused() -> None:
    with pytest.raises(ValueError, match="before 1950"):
        der.time(dt.datetime(1949, 12, 31, 23, 59, 59, tzinfo=UTC))


def test_ia5_strings_are_ascii_only() -> None:
    assert der.ia5_string(0x82, "a.b") == b"\x82\x03a.b"
    with pytest.raises(ValueError, match="not ASCII"):
        der.ia5_string(0x82, "bücher.example")


def test_pem_is_what_cryptography_writes(root_ca: CertificateAuthority) -> None:
    cert_der = root_ca.cert.public_bytes(serialization.Encoding.DER)
    assert der.pem(cert_der) == root_ca.cert_pem
    # a body whose base64 ends exactly at a line's end, and one of a single short line
    for size in (48, 96, 5):
        text = der.pem(bytes(size), "TEST").decode()
        lines = text.splitlines()
        assert lines[0] == "-----BEGIN TEST-----"
        assert lines[-1] == "-----END TEST-----"
        assert all(len(line) <= 64 for line in lines[1:-1])
        assert len(lines) == 2 + -(-size // 48)
