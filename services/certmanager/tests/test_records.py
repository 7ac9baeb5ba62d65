"""Certificate records: the durable form keeps the key, every other form leaves it out."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from trellis_certmanager.domain.issuer import Issuer
from trellis_certmanager.domain.records import CertificateRecord
from trellis_common.model import MeshService

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


def test_round_trip_keeps_everything(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    assert CertificateRecord.from_json(record.to_json()) == record


def test_metadata_and_repr_never_carry_the_key(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    assert b"PRIVATE KEY" in record.key_pem
    assert "PRIVATE KEY" not in json.dumps(record.metadata())
    assert "PRIVATE KEY" not in repr(record)
    assert "key_pem" not in record.metadata()


@pytest.mark.parametrize("payload", ["", "{}", '{"common_name": "x"}', "[1]"])
def test_malformed_record_is_a_clear_error(payload: str) -> None:
    with pytest.raises(ValueError, match="malformed certificate record"):
        CertificateRecord.from_json(payload)
