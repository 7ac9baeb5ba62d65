"""Registered workloads: validation naming the bad field, liveness, the stored JSON record."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import pytest

from trellis_endpoints_vm.domain.views import EndpointInfo
from trellis_endpoints_vm.domain.workloads import (
    MAX_WEIGHT,
    InvalidWorkload,
    Workload,
    from_json,
    holds_token,
    new_heartbeat_token,
    to_json,
    validate,
)

MakeWorkload = Callable[..., Workload]

# --- validate -----------------------------------------------------------------------------

INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("namespace empty", {"namespace": ""}, "namespace"),
    ("namespace upper case", {"namespace": "Shop"}, "namespace"),
    ("namespace with a dot", {"namespace": "shop.prod"}, "namespace"),
    ("namespace too long", {"namespace": "n" * 64}, "namespace"),
    ("name empty", {"name": ""}, "name"),
    ("name with underscore", {"name": "vm_1"}, "name"),
    ("name starts with a dash", {"name": "-vm"}, "name"),
    ("services empty", {"services": ()}, "services"),
    ("services duplicate", {"services": ("api", "api")}, "services"),
    ("services bad label", {"services": ("api", "Bad_Label")}, "services[1]"),
    ("services dotted", {"services": ("api.v1",)}, "services[0]"),
    ("address is a hostname", {"address": "vm-1.example.com"}, "address"),
    ("address out of range", {"address": "10.0.0.256"}, "address"),
    ("address empty", {"address": ""}, "address"),
    ("address is a CIDR", {"address": "10.0.0.0/24"}, "address"),
    ("ports empty", {"ports": ()}, "ports"),
    ("ports duplicate names", {"ports": (("http", 80), ("http", 81))}, "ports"),
    ("ports bare number with others", {"ports": (("", 80), ("grpc", 81))}, "ports"),
    ("ports zero", {"ports": (("http", 0),)}, "ports[http]"),
    ("ports above 65535", {"ports": (("http", 65536),)}, "ports[http]"),
    ("ports bare and out of range", {"ports": (("", 70000),)}, "ports[70000]"),
    ("ports bad name", {"ports": (("Bad_Name", 80),)}, "ports[Bad_Name]"),
    ("service_account bad", {"service_account": "Bad Account"}, "service_account"),
    ("locality four parts", {"locality": "us/east/a/rack-1"}, "locality"),
    ("weight negative", {"weight": -1}, "weight"),
    ("weight too large", {"weight": MAX_WEIGHT + 1}, "weight"),
    ("ttl zero", {"ttl": 0.0}, "ttl"),
    ("ttl below one second", {"ttl": 0.5}, "ttl"),
    ("ttl above one day", {"ttl": 86401.0}, "ttl"),
    ("ttl not a number", {"ttl": math.nan}, "ttl"),
    ("ttl infinite", {"ttl": math.inf}, "ttl"),
    ("labels empty key", {"labels": (("", "x"),)}, "labels"),
    ("labels key too long", {"labels": (("k" * 318, "x"),)}, "labels"),
]


@pytest.mark.parametrize(
    ("changes", "field"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_field_is_named(
    make_workload: MakeWorkload, changes: dict[str, Any], field: str
) -> None:
    bad = make_workload(**changes)
    with pytest.raises(InvalidWorkload) as caught:
        validate(bad)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")
    assert caught.value.reason


VALID: list[tuple[str, dict[str, Any]]] = [
    ("defaults", {}),
    ("ipv6 address", {"address": "fd00::1"}),
    ("bare port alone", {"ports": (("", 8080),)}),
    ("lowest and highest ports", {"ports": (("low", 1), ("high", 65535))}),
    ("several services", {"services": ("api", "web", "admin")}),
    ("full locality", {"locality": "us-east/zone-a/rack-1"}),
    ("region only", {"locality": "us-east"}),
    ("service account", {"service_account": "api.sa"}),
    ("weight zero", {"weight": 0}),
    ("weight max", {"weight": MAX_WEIGHT}),
    ("ttl one second", {"ttl": 1.0}),
    ("ttl one day", {"ttl": 86400.0}),
    ("no ttl", {"ttl": None}),
    ("labels", {"labels": (("app", "api"), ("example.com/tier", "back"))}),
]


@pytest.mark.parametrize("changes", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_workload_is_returned_unchanged(
    make_workload: MakeWorkload, changes: dict[str, Any]
) -> None:
    good = make_workload(**changes)
    assert validate(good) is good


def test_the_first_bad_field_is_reported(make_workload: MakeWorkload) -> None:
    bad = make_workload(namespace="Bad", address="nowhere", ports=())
    with pytest.raises(InvalidWorkload) as caught:
        validate(bad)
    assert caught.value.field == "namespace"


# --- liveness ------------------------------------------------------------------------------


def test_without_ttl_a_workload_is_alive_forever(make_workload: MakeWorkload) -> None:
    forever = make_workload(ttl=None, last_heartbeat=10.0)
    assert forever.expires_at is None
    assert forever.alive(0.0)
    assert forever.alive(1e12)


@pytest.mark.parametrize(
    ("now", "alive"), [(100.0, True), (129.999, True), (130.0, False), (500.0, False)]
)
def test_a_workload_with_ttl_is_alive_until_last_heartbeat_plus_ttl(
    make_workload: MakeWorkload, now: float, alive: bool
) -> None:
    beating = make_workload(ttl=30.0, last_heartbeat=100.0)
    assert beating.expires_at == 130.0
    assert beating.alive(now) is alive


def test_beat_moves_the_heartbeat_and_nothing_else(make_workload: MakeWorkload) -> None:
    original = make_workload(ttl=30.0, registered_at=50.0, last_heartbeat=100.0)
    beaten = original.beat(200.0)
    assert beaten.last_heartbeat == 200.0
    assert beaten.expires_at == 230.0
    assert beaten.alive(229.0)
    assert dataclasses.replace(beaten, last_heartbeat=100.0) == original
    assert original.last_heartbeat == 100.0  # frozen: the original is untouched


def test_endpoint_carries_the_workload_and_defaults_the_service_account(
    make_workload: MakeWorkload,
) -> None:
    w = make_workload(
        labels=(("app", "api"),),
        locality="us-east/zone-a",
        network="vm-net",
        weight=3,
    )
    assert w.endpoint() == EndpointInfo(
        address="10.0.0.1",
        ports=(("http", 8080),),
        labels=(("app", "api"),),
        locality="us-east/zone-a",
        network="vm-net",
        weight=3,
        service_account="default",
        workload="shop/vm-1",
        source="registration",
    )
    assert w.endpoint(ports=(("http", 9090),), source="x").ports == (("http", 9090),)
    assert dataclasses.replace(w, service_account="api").endpoint().service_account == "api"


# --- the stored record --------------------------------------------------------------------

ROUND_TRIP: list[tuple[str, dict[str, Any]]] = [
    ("minimal", {}),
    (
        "every field",
        {
            "name": "db-2",
            "services": ("db", "db-replica"),
            "address": "fd00::2",
            "ports": (("mongo", 27017), ("metrics", 9100)),
            "labels": (("app", "db"), ("version", "v2")),
            "service_account": "db",
            "locality": "eu/west/1",
            "network": "vm-net",
            "weight": 7,
            "ttl": 45.5,
            "registered_at": 12.25,
            "last_heartbeat": 99.75,
        },
    ),
    ("no ttl, bare port", {"ttl": None, "ports": (("", 80),)}),
]


@pytest.mark.parametrize("fields", [c[1] for c in ROUND_TRIP], ids=[c[0] for c in ROUND_TRIP])
def test_json_round_trip(make_workload: MakeWorkload, fields: dict[str, Any]) -> None:
    original = make_workload(**fields)
    text = to_json(original)
    assert from_json(text) == original
    assert from_json(text.encode()) == original


def test_json_labels_come_back_sorted(make_workload: MakeWorkload) -> None:
    record = json.loads(to_json(make_workload()))
    record["labels"] = {"zone": "a", "app": "api"}
    assert from_json(json.dumps(record)).labels == (("app", "api"), ("zone", "a"))


RECORD_KEYS = [
    "namespace",
    "name",
    "services",
    "address",
    "ports",
    "labels",
    "service_account",
    "locality",
    "network",
    "weight",
    "ttl",
    "registered_at",
    "last_heartbeat",
]


def test_the_record_has_every_field(make_workload: MakeWorkload) -> None:
    assert sorted(json.loads(to_json(make_workload()))) == sorted(
        [*RECORD_KEYS, "heartbeat_token_sha256"]
    )


def test_a_record_keeps_the_heartbeat_token_s_digest_only(make_workload: MakeWorkload) -> None:
    token, digest = new_heartbeat_token()
    workload = dataclasses.replace(make_workload(), heartbeat_digest=digest)
    stored = to_json(workload)
    assert token not in stored
    assert from_json(stored) == workload
    assert holds_token(workload, token)
    assert not holds_token(workload, new_heartbeat_token()[0])
    assert "heartbeat_digest" not in repr(workload)


def test_a_record_stored_before_heartbeat_tokens_loads_without_one(
    make_workload: MakeWorkload,
) -> None:
    record = json.loads(to_json(make_workload()))
    del record["heartbeat_token_sha256"]
    loaded = from_json(json.dumps(record))
    assert loaded.heartbeat_digest == ""
    assert not holds_token(loaded, "")  # no token matches a workload that has none
    record["heartbeat_token_sha256"] = "not a digest"
    with pytest.raises(ValueError, match="heartbeat_token_sha256 must be 64"):
        from_json(json.dumps(record))


@pytest.mark.parametrize("key", RECORD_KEYS)
def test_a_record_missing_a_key_is_malformed(make_workload: MakeWorkload, key: str) -> None:
    record = json.loads(to_json(make_workload()))
    del record[key]
    with pytest.raises(ValueError, match="malformed workload record"):
        from_json(json.dumps(record))


BAD_VALUES: list[tuple[str, str, object]] = [
    ("labels not a mapping", "labels", ["app"]),
    ("port not a pair", "ports", [["http"]]),
    ("port number not a number", "ports", [["http", "x"]]),
    ("ports not a list", "ports", 8080),
    ("ttl not a number", "ttl", "soon"),
    ("weight null", "weight", None),
    ("registered_at not a number", "registered_at", "yesterday"),
]


@pytest.mark.parametrize(
    ("key", "value"), [c[1:] for c in BAD_VALUES], ids=[c[0] for c in BAD_VALUES]
)
def test_a_record_with_a_bad_value_is_malformed(
    make_workload: MakeWorkload, key: str, value: object
) -> None:
    record = json.loads(to_json(make_workload()))
    record[key] = value
    with pytest.raises(ValueError, match="malformed workload record") as caught:
        from_json(json.dumps(record))
    assert not isinstance(caught.value, InvalidWorkload)


@pytest.mark.parametrize("text", ["{not json", "", "null", "[1, 2]", '"a string"', b"\xff"])
def test_a_record_that_is_not_a_json_object_is_malformed(text: str | bytes) -> None:
    with pytest.raises(ValueError, match="malformed workload record"):
        from_json(text)
