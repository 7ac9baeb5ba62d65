"""Sealing: a round trip, and every way a sealed value can be wrong is refused by name."""

from __future__ import annotations

import base64

import pytest

from trellis_certmanager.domain.sealed import KEK_BYTES, Kek, Sealer, SealError, is_sealed

KEY = b"-----BEGIN PRIVATE KEY-----\nnot really\n-----END PRIVATE KEY-----\n"
HERE = "trellis:certmanager:certs[cart.shop.svc.cluster.local]"


@pytest.fixture
def sealer() -> Sealer:
    return Sealer(Kek.generate())


def test_round_trip(sealer: Sealer) -> None:
    sealed = sealer.seal(KEY, HERE)
    assert is_sealed(sealed)
    assert sealed.startswith(f"tsv1:{sealer.current.id}:")
    assert b"PRIVATE KEY" not in base64.urlsafe_b64decode(sealed.split(":")[2])
    assert sealer.unseal(sealed, HERE) == KEY


def test_each_seal_takes_a_new_nonce(sealer: Sealer) -> None:
    assert sealer.seal(KEY, HERE) != sealer.seal(KEY, HERE)


def test_another_kek_is_refused_by_id(sealer: Sealer) -> None:
    sealed = Sealer(Kek.generate()).seal(KEY, HERE)
    with pytest.raises(SealError, match=r"sealed under KEK .* start it with the KEK file"):
        sealer.unseal(sealed, HERE)


def test_a_value_moved_to_another_record_is_refused(sealer: Sealer) -> None:
    sealed = sealer.seal(KEY, HERE)
    elsewhere = "trellis:certmanager:certs[books.shop.svc.cluster.local]"
    with pytest.raises(SealError, match=r"does not authenticate for .*books.*copied here"):
        sealer.unseal(sealed, elsewhere)


@pytest.mark.parametrize("position", [0, 11, 12, 30, -1])
def test_a_tampered_byte_is_refused(sealer: Sealer, position: int) -> None:
    header, body = sealer.seal(KEY, HERE).rsplit(":", 1)
    raw = bytearray(base64.urlsafe_b64decode(body))
    raw[position] ^= 0x01  # the nonce, the ciphertext or the tag
    tampered = f"{header}:{base64.urlsafe_b64encode(bytes(raw)).decode()}"
    with pytest.raises(SealError, match="was altered"):
        sealer.unseal(tampered, HERE)


def test_a_kek_id_changed_in_the_header_is_refused(sealer: Sealer) -> None:
    old = Kek.generate()
    rotated = Sealer(sealer.current, previous=[old])
    sealed = rotated.seal(KEY, HERE).replace(sealer.current.id, old.id)
    with pytest.raises(SealError, match="was altered"):
        rotated.unseal(sealed, HERE)


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("-----BEGIN PRIVATE KEY-----", "not a sealed value"),
        ("tsv1::abc", "not a sealed value"),
        ("tsv9:0123:abcd", "unknown sealing scheme 'tsv9'"),
        ("tsv1:{id}:***", "not base64url"),
        ("tsv1:{id}:AAAA", "too short"),
    ],
)
def test_malformed_values_are_named(sealer: Sealer, value: str, complaint: str) -> None:
    with pytest.raises(SealError, match=complaint):
        sealer.unseal(value.format(id=sealer.current.id), HERE)


def test_after_rotation_old_values_still_unseal_and_new_ones_use_the_new_kek() -> None:
    old, new = Kek.generate(), Kek.generate()
    sealed_before = Sealer(old).seal(KEY, HERE)
    rotated = Sealer(new, previous=[old])
    assert rotated.unseal(sealed_before, HERE) == KEY
    assert rotated.seal(KEY, HERE).startswith(f"tsv1:{new.id}:")


def test_a_kek_is_32_bytes_and_never_shown() -> None:
    with pytest.raises(SealError, match=f"a KEK is {KEK_BYTES} bytes, got 16"):
        Kek(b"x" * 16)
    kek = Kek(b"k" * KEK_BYTES)
    assert "kkkk" not in repr(kek)
    assert kek.key.hex() not in kek.id
    assert len(kek.id) == 16
