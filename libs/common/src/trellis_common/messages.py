"""Frozen domain records into protobuf messages, where the two have the same fields.

The services keep their domain model in frozen dataclasses and meet protobuf only at the
transport. Many records are the message field for field (an endpoint, a cluster
endpoint, an external service); writing ``address=e.address, port=e.port, ...`` for each
repeats the field list the dataclass already holds, in every service, and silently drops a
field added to both. :func:`fields` hands the dataclass's own fields to the message's
constructor instead, so a field the message lacks fails loudly (protobuf's ``ValueError``).

Pairs become maps: the model keeps maps as sorted tuples of pairs (hashable, frozen), the
message as ``map<...>``; ``maps`` names those fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any


def fields(record: Any, maps: Collection[str] = ()) -> dict[str, Any]:
    """``record``'s fields as keyword arguments for a message (top level only, not deep).

    ``maps`` names the fields held as pairs that the message holds as a map.
    """
    return {
        field.name: dict(value) if field.name in maps else value
        for field in dataclasses.fields(record)
        for value in [getattr(record, field.name)]
    }


def delimited(member: Any) -> bytes:
    """``member`` (a message) on the wire as a field's value: its length, then its bytes.

    Kept per member and joined by :func:`repeated`, they make a repeated message field that
    ``MergeFromString`` appends in order, C doing the work: for a service of 200 endpoints
    whose one moved, one endpoint serialized and a join, where building the field from 200
    message objects copies each of them in Python's loop.
    """
    data: bytes = member.SerializeToString(deterministic=True)
    return varint(len(data)) + data


def repeated(message: Any, field: str, members: Sequence[bytes]) -> bytes:
    """The repeated message field ``field`` of ``message`` (a message or its class) on the
    wire, its ``members`` :func:`delimited`: merge it into a ``message`` to append them."""
    if not members:
        return b""
    tag = varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | 2)
    return tag + tag.join(members)


def field(number: int, data: bytes) -> bytes:
    """A length-delimited field (wire type 2) on the wire: its key, length and bytes."""
    return b"".join((varint(number << 3 | 2), varint(len(data)), data))


def varint(value: int) -> bytes:
    """A non-negative integer as protobuf's base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
