"""Certificate records: the durable form keeps the key, every other form leaves it out."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace

import pytest

from trellis_certmanager.domain.issuer import Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm, generate_key, key_to_pem
from trellis_certmanager.domain.records import (
    CertificateRecord,
    InvalidRecord,
    check,
    in_the_clear,
    past_expiry,
    without_proxy_key,
)
from trellis_certmanager.domain.sealed import Kek, Sealer
from trellis_certmanager.testing import proxy_key
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)


SEALER = Sealer(Kek.generate())
WHERE = "trellis:certmanager:certs[svc.ns.svc.cluster.local]"


def seal(pem: bytes) -> str:
    return SEALER.seal(pem, WHERE)


def unseal(value: str) -> bytes:
    return SEALER.unseal(value, WHERE)


def test_round_trip_keeps_everything(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    assert CertificateRecord.from_json(record.to_json(seal), unseal) == record


def test_the_durable_form_holds_the_key_sealed_only(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    durable = record.to_json(seal)
    assert "PRIVATE KEY" not in durable
    assert "key_pem" not in json.loads(durable)
    assert not in_the_clear(json.loads(durable))


def test_a_record_written_in_the_clear_by_an_older_version_is_read(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    body = {**record.metadata(), "cert_chain_pem": record.cert_chain_pem.decode()}
    body["key_pem"] = record.key_pem.decode()
    assert in_the_clear(body)
    assert CertificateRecord.from_json(json.dumps(body), unseal) == record


def test_a_proxy_record_has_no_key_and_its_durable_form_no_key_field(issuer: Issuer) -> None:
    proxy = issuer.issue_proxy(
        ProxyCommonName.new("bookstore", "bookstore"), "bookstore", NOW, public_key=proxy_key()
    )
    assert proxy.key_pem == b""
    durable = json.loads(proxy.to_json(seal))
    assert "key_sealed" not in durable
    assert "key_pem" not in durable
    assert check(CertificateRecord.from_json(json.dumps(durable), unseal)) == proxy
    assert without_proxy_key(proxy) is None


def test_a_proxy_record_an_older_version_stored_with_its_key_loads(issuer: Issuer) -> None:
    key = generate_key(KeyAlgorithm.ECDSA_P256)
    cn = ProxyCommonName.new("bookstore", "bookstore")
    old = replace(
        issuer.issue_proxy(cn, "bookstore", NOW, public_key=key.public_key()),
        key_pem=key_to_pem(key),
    )
    loaded = check(CertificateRecord.from_json(old.to_json(seal), unseal))
    assert loaded == old  # the key is checked against the certificate like any other
    assert without_proxy_key(loaded) == replace(old, key_pem=b"")
    mismatched = replace(old, key_pem=key_to_pem(generate_key(KeyAlgorithm.ECDSA_P256)))
    with pytest.raises(InvalidRecord, match="does not match the certificate"):
        check(mismatched)


def test_a_service_record_without_a_key_is_refused(issuer: Issuer) -> None:
    service = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    body = json.loads(service.to_json(seal))
    del body["key_sealed"]
    with pytest.raises(ValueError, match="key_sealed"):
        CertificateRecord.from_json(json.dumps(body), unseal)
    with pytest.raises(InvalidRecord, match="key_pem is empty"):
        check(replace(service, key_pem=b""))


def test_a_key_that_does_not_unseal_is_a_clear_error(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    other = Sealer(Kek.generate())
    durable = record.to_json(lambda pem: other.seal(pem, WHERE))
    with pytest.raises(ValueError, match="the key cannot be unsealed: sealed under KEK"):
        CertificateRecord.from_json(durable, unseal)


def test_metadata_and_repr_never_carry_the_key(issuer: Issuer) -> None:
    record = issuer.issue_service(MeshService("ns", "svc"), "sa", NOW)
    assert b"PRIVATE KEY" in record.key_pem
    assert "PRIVATE KEY" not in json.dumps(record.metadata())
    assert "PRIVATE KEY" not in repr(record)
    assert "key_pem" not in record.metadata()


@pytest.mark.parametrize("payload", ["", "{}", '{"common_name": "x"}', "[1]"])
def test_malformed_record_is_a_clear_error(payload: str) -> None:
    with pytest.raises(ValueError, match="malformed certificate record"):
        CertificateRecord.from_json(payload, unseal)


@pytest.mark.parametrize(
    "payload",
    ['{"common_name": "x", "cert_chain_pem": 1}', '{"kind": "banana"}', '"text"', "null"],
)
def test_a_record_of_the_wrong_shape_is_a_clear_error(payload: str) -> None:
    with pytest.raises(ValueError, match="malformed certificate record"):
        CertificateRecord.from_json(payload, unseal)


# --- check: a stored record is held to what the issuer makes -------------------------------

BOOKSTORE = MeshService("bookstore", "bookstore")


def test_records_the_issuer_makes_pass(issuer: Issuer) -> None:
    service = issuer.issue_service(BOOKSTORE, "bookstore", NOW)
    proxy = issuer.issue_proxy(
        ProxyCommonName.new("bookstore", "bookstore"), "bookstore", NOW, public_key=proxy_key()
    )
    assert check(service) is service
    assert check(proxy) is proxy


def test_a_proxy_record_with_an_invalid_service_account_is_refused(issuer: Issuer) -> None:
    """As an older version, which did not validate accounts, may have stored it."""
    proxy = issuer.issue_proxy(
        ProxyCommonName.new("bookstore", "bookstore"), "Bad Name!", NOW, public_key=proxy_key()
    )
    with pytest.raises(InvalidRecord, match="service account 'Bad Name!' is not a valid"):
        check(proxy)


def test_damaged_records_are_refused_naming_the_fault(issuer: Issuer) -> None:
    record = issuer.issue_service(BOOKSTORE, "bookstore", NOW)
    other = issuer.issue_service(MeshService("bookstore", "other"), "bookstore", NOW)
    cases = {
        "cert_chain_pem is not a PEM certificate": replace(record, cert_chain_pem=b"garbage"),
        "key_pem is not an unencrypted PEM private key": replace(record, key_pem=b"garbage"),
        "key_pem does not match the certificate": replace(record, key_pem=other.key_pem),
        "another certificate than the record describes": replace(
            record, cert_chain_pem=other.cert_chain_pem
        ),
        "is not the service certificate of bookstore/other": replace(record, service="other"),
        "not_after has no time zone": replace(record, not_after=NOW.replace(tzinfo=None)),
        "namespace 'Bookstore'": replace(record, namespace="Bookstore"),
    }
    for message, damaged in cases.items():
        with pytest.raises(InvalidRecord, match=message):
            check(damaged)


def test_a_proxy_record_under_another_proxy_s_name_is_refused(issuer: Issuer) -> None:
    proxy = issuer.issue_proxy(
        ProxyCommonName.new("bookstore", "bookstore"), "bookstore", NOW, public_key=proxy_key()
    )
    with pytest.raises(InvalidRecord, match="does not match proxy_id"):
        check(replace(proxy, proxy_id="0" * 8 + "-0000-4000-8000-" + "0" * 12))


def test_past_expiry_keeps_a_grace(issuer: Issuer) -> None:
    record = issuer.issue_service(BOOKSTORE, "bookstore", NOW)
    grace = dt.timedelta(hours=1)
    assert past_expiry([record], record.not_after, grace) == []
    assert past_expiry([record], record.not_after + grace, grace) == [record.common_name]
