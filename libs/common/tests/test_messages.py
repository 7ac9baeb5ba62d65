"""``messages.fields``: a frozen record's fields become a message's, pairs become maps;
``messages.delimited`` and ``repeated``: members on the wire, joined into a repeated field."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_api import endpoints_pb2
from trellis_common.messages import delimited, field, fields, repeated, varint


@dataclass(frozen=True, slots=True)
class _Endpoint:
    address: str
    port: int
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class _Nested:
    address: str
    inner: _Endpoint


def test_a_record_becomes_the_message_with_the_same_fields() -> None:
    record = _Endpoint("10.0.0.1", 8080, (("app", "api"), ("tier", "web")))
    message = pb.ClusterEndpoint(**fields(record, maps={"labels"}))
    assert message.address == "10.0.0.1"
    assert message.port == 8080
    assert dict(message.labels) == {"app": "api", "tier": "web"}


def test_fields_are_copied_at_the_top_level_only() -> None:
    inner = _Endpoint("10.0.0.1", 1)
    assert fields(_Nested("x", inner)) == {"address": "x", "inner": inner}


def test_a_field_the_message_lacks_fails_loudly() -> None:
    with pytest.raises(ValueError, match="inner"):
        pb.ClusterEndpoint(**fields(_Nested("x", _Endpoint("10.0.0.1", 1))))


def test_entries_joined_and_merged_are_the_repeated_field() -> None:
    members = [
        endpoints_pb2.Endpoint(address=f"10.0.0.{i}", ports={"http": 80 + i}, labels={"v": str(i)})
        for i in range(200)  # lengths past 127 bytes of field 3 and more
    ]
    members.append(endpoints_pb2.Endpoint(address="x" * 300, workload="w"))  # a length of two bytes
    built = endpoints_pb2.ServiceEndpoints(revision=7)
    built.MergeFromString(
        repeated(endpoints_pb2.ServiceEndpoints, "endpoints", [delimited(m) for m in members])
    )
    assert list(built.endpoints) == members
    assert built == endpoints_pb2.ServiceEndpoints(revision=7, endpoints=members)
    field = repeated(built, "endpoints", [delimited(members[0])])
    assert field[0] == (2 << 3 | 2)  # endpoints is field 2, length-delimited
    assert repeated(built, "endpoints", []) == b""


def test_a_field_on_the_wire_is_what_protobuf_reads() -> None:
    for length in (0, 1, 127, 128, 300, 20_000):  # lengths of one, two and three bytes
        address = "a" * length
        assert endpoints_pb2.Endpoint.FromString(field(1, address.encode())).address == address
    assert varint(0) == b"\x00"
    assert varint(300) == b"\xac\x02"
