"""``messages.fields``: a frozen record's fields become a message's, pairs become maps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trellis_api import catalog_pb2 as pb
from trellis_common.messages import fields


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
