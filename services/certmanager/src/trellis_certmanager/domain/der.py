"""DER (ITU-T X.690), as little of it as a leaf certificate needs, and PEM around it.

certmanager encodes the to-be-signed part of its leaves itself
(:mod:`~trellis_certmanager.domain.template`): the encoding is a small fixed shape, and
building it with ``x509.CertificateBuilder`` cost several times the signature. Only what
that shape uses is here, each in its one distinguished form: definite lengths in the fewest
bytes, non-negative INTEGERs with a leading zero octet when the high bit is set, and the
times RFC 5280 4.1.2.5 prescribes (UTCTime up to 2049, GeneralizedTime from 2050, both in
UTC to the second, with ``Z``). Anything outside that raises ``ValueError``; nothing is
encoded approximately.
"""

from __future__ import annotations

import binascii
import datetime as dt

INTEGER = 0x02
BIT_STRING = 0x03
OCTET_STRING = 0x04
NULL = b"\x05\x00"
OBJECT_IDENTIFIER = 0x06
UTF8_STRING = 0x0C
SEQUENCE = 0x30
SET = 0x31
TRUE = b"\x01\x01\xff"

_UTC_TIME_YEARS = range(1950, 2050)  # RFC 5280 4.1.2.5.1: the years UTCTime stands for


def tlv(tag: int, body: bytes) -> bytes:
    """A single-octet ``tag``, the definite length of ``body`` in its shortest form, ``body``."""
    size = len(body)
    if size < 0x80:
        return bytes((tag, size)) + body
    octets = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(octets))) + octets + body


def sequence(*items: bytes) -> bytes:
    return tlv(SEQUENCE, b"".join(items))


def integer(value: int) -> bytes:
    """A non-negative INTEGER: big-endian, with a leading zero octet if the high bit is set
    (or it would read as negative), and no other leading zeros."""
    if value < 0:
        raise ValueError(f"negative INTEGER {value}: not used in a certificate here")
    return tlv(INTEGER, value.to_bytes(value.bit_length() // 8 + 1, "big"))


def oid(dotted: str) -> bytes:
    """An OBJECT IDENTIFIER from its dotted form, e.g. ``"2.5.4.3"``."""
    arcs = [int(arc) for arc in dotted.split(".")]
    if len(arcs) < 2 or arcs[0] > 2 or (arcs[0] < 2 and arcs[1] >= 40):
        raise ValueError(f"not an object identifier: {dotted!r}")
    body = bytearray()
    for arc in [arcs[0] * 40 + arcs[1], *arcs[2:]]:
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        body += bytes(reversed(chunk))
    return tlv(OBJECT_IDENTIFIER, bytes(body))


def utf8_string(text: str) -> bytes:
    return tlv(UTF8_STRING, text.encode("utf-8"))


def ia5_string(tag: int, text: str) -> bytes:
    """``text`` as IA5String content under ``tag`` (a SAN's implicit tag); ``ValueError``
    for a character outside ASCII, as X.509 DNS names and URIs must be."""
    try:
        return tlv(tag, text.encode("ascii"))
    except UnicodeEncodeError:
        raise ValueError(f"{text!r} is not ASCII: use its A-label (IDNA) form") from None


def octet_string(body: bytes) -> bytes:
    return tlv(OCTET_STRING, body)


def bit_string(body: bytes) -> bytes:
    """A BIT STRING of whole octets (no unused bits), as signatures are."""
    return tlv(BIT_STRING, b"\x00" + body)


def utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` in UTC, without a zone; a naive datetime is taken as UTC already."""
    if moment.tzinfo is None:
        return moment
    offset = moment.utcoffset()
    return moment.replace(tzinfo=None) - offset if offset else moment.replace(tzinfo=None)


def time(moment: dt.datetime) -> bytes:
    """A certificate's Time (RFC 5280 4.1.2.5): UTCTime for 1950 to 2049, GeneralizedTime
    from 2050, to the second (a fraction is dropped). A naive datetime is taken as UTC."""
    moment = utc(moment)
    year = moment.year
    fields = (moment.month, moment.day, moment.hour, moment.minute, moment.second)
    if year in _UTC_TIME_YEARS:
        return b"\x17\x0d%02d%02d%02d%02d%02d%02dZ" % (year % 100, *fields)
    if year < _UTC_TIME_YEARS.start:
        raise ValueError(f"{moment.isoformat()} is before 1950: a certificate cannot say it")
    return b"\x18\x0f%04d%02d%02d%02d%02d%02dZ" % (year, *fields)


def pem(der: bytes, label: str = "CERTIFICATE") -> bytes:
    """RFC 7468 text: the label's lines around the base64, 64 characters (48 octets) a line."""
    lines = b"".join([binascii.b2a_base64(der[i : i + 48]) for i in range(0, len(der), 48)])
    name = label.encode("ascii")
    return b"-----BEGIN %s-----\n%s-----END %s-----\n" % (name, lines, name)
