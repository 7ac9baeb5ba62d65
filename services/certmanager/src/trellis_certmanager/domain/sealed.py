"""Sealing private keys before they are stored: AES-256-GCM under a key-encryption key.

Redis is shared by every component and backed up as a whole, so nothing in it may be a
key in the clear. A sealed value is one line of text::

    tsv1:<kek id>:<base64url(nonce || ciphertext || tag)>

- ``tsv1`` names the scheme, so a later one can be told apart (and old values still read);
- the KEK id is a fingerprint of the KEK (not the KEK), so a value says which KEK sealed
  it: rotating the KEK means unsealing with the old one and sealing with the new one, and a
  value sealed under a KEK this process does not hold is refused by name, not as garbage;
- the nonce is 96 random bits, new for every seal;
- the associated data is the header plus the *context*, the place the value is stored at
  (for a certificate record, ``<hash>[<common name>]``): a sealed key copied to another
  record fails authentication instead of being served as that record's key.

Every failure is a :class:`SealError` whose message says what is wrong and never shows a
byte of the value or of the KEK.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SCHEME = "tsv1"
KEK_BYTES = 32
NONCE_BYTES = 12
_TAG_BYTES = 16


class SealError(ValueError):
    """A value cannot be sealed or unsealed; the message says why (and shows no secret)."""


@dataclass(frozen=True, slots=True)
class Kek:
    """A key-encryption key: 32 bytes, known by a short fingerprint (its ``id``)."""

    key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        if len(self.key) != KEK_BYTES:
            raise SealError(f"a KEK is {KEK_BYTES} bytes, got {len(self.key)}")

    @property
    def id(self) -> str:
        """16 hex digits of SHA-256 over a label and the KEK: names it, reveals nothing."""
        return hashlib.sha256(b"trellis-kek-id\0" + self.key).hexdigest()[:16]

    @classmethod
    def generate(cls) -> Kek:
        return cls(os.urandom(KEK_BYTES))


def kek_id_of(value: str) -> str:
    """The id of the KEK that sealed ``value`` (``""`` if it is not a sealed value)."""
    parts = value.split(":")
    return parts[1] if len(parts) == 3 and parts[0] == SCHEME else ""


def is_sealed(value: str) -> bool:
    """Whether ``value`` is in the sealed form (of any KEK), as opposed to a legacy PEM."""
    return value.startswith(SCHEME + ":")


class Sealer:
    """Seals under the current KEK; unseals under it or any ``previous`` one (rotation)."""

    def __init__(self, current: Kek, previous: Iterable[Kek] = ()) -> None:
        self.current = current
        self._keks = {k.id: k for k in (*previous, current)}

    def stale(self, value: object) -> bool:
        """Whether ``value`` is sealed under a previous KEK (to be sealed again)."""
        return isinstance(value, str) and kek_id_of(value) not in ("", self.current.id)

    def seal(self, plaintext: bytes, context: str) -> str:
        header = f"{SCHEME}:{self.current.id}"
        nonce = os.urandom(NONCE_BYTES)
        body = AESGCM(self.current.key).encrypt(nonce, plaintext, _aad(header, context))
        return f"{header}:{base64.urlsafe_b64encode(nonce + body).decode()}"

    def unseal(self, value: str, context: str) -> bytes:
        """The plaintext of ``value`` sealed for ``context``; :class:`SealError` otherwise."""
        scheme, kek_id, body = _split(value)
        kek = self._keks.get(kek_id)
        if kek is None:
            raise SealError(
                f"sealed under KEK {kek_id}, but this certmanager holds KEK "
                f"{', '.join(sorted(self._keks))}: start it with the KEK file that sealed it"
            )
        try:
            raw = base64.b64decode(body.encode(), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise SealError("the sealed body is not base64url") from None
        if len(raw) < NONCE_BYTES + _TAG_BYTES:
            raise SealError(f"the sealed body is too short ({len(raw)} bytes)")
        try:
            return AESGCM(kek.key).decrypt(
                raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(f"{scheme}:{kek_id}", context)
            )
        except InvalidTag:
            raise SealError(
                f"the sealed value does not authenticate for {context}: it was altered, or "
                "copied here from another record"
            ) from None


def _aad(header: str, context: str) -> bytes:
    return f"{header}\0{context}".encode()


def _split(value: str) -> tuple[str, str, str]:
    parts = value.split(":")
    if len(parts) != 3 or not all(parts):
        raise SealError(f"not a sealed value: expected {SCHEME}:<kek id>:<body>")
    if parts[0] != SCHEME:
        raise SealError(f"unknown sealing scheme {parts[0][:16]!r} (this version reads {SCHEME})")
    return parts[0], parts[1], parts[2]
