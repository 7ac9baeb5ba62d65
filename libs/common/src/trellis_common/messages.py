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
from collections.abc import Collection
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
