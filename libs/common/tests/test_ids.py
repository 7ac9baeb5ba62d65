"""Tests for trellis_common.ids: DNS-1123 names, proxy and service CNs, SPIFFE IDs."""

from __future__ import annotations

import pickle
import uuid

import pytest

from trellis_common import ids
from trellis_common.ids import (
    InvalidIdentifier,
    ProxyCommonName,
    ProxyId,
    ServiceCommonName,
    SpiffeId,
)
from trellis_common.model import MeshService

UUID = "123e4567-e89b-42d3-a456-426614174000"
CHARS_REASON = "must consist of lower case alphanumeric characters or '-'"


# --- DNS-1123 labels and subdomains -------------------------------------------------------


@pytest.mark.parametrize("value", ["a", "bookstore", "bookstore-v1", "1abc", "a" * 63, "0"])
def test_valid_dns_labels_are_returned_unchanged(value: str) -> None:
    assert ids.validate_dns_label(value, "service name") == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must not be empty"),
        ("a" * 64, "must be no more than 63 characters, got 64"),
        ("Book_Store", CHARS_REASON),
        ("BookStore", CHARS_REASON),
        ("book_store", CHARS_REASON),
        ("-bookstore", CHARS_REASON),
        ("bookstore-", CHARS_REASON),
        ("book.store", CHARS_REASON),
        ("bookstore\n", CHARS_REASON),
        ("bøøk", CHARS_REASON),
    ],
)
def test_invalid_dns_labels_name_field_value_and_reason(value: str, reason: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        ids.validate_dns_label(value, "service name")
    err = caught.value
    assert (err.field, err.value) == ("service name", value)
    assert err.reason.startswith(reason)
    assert str(err).startswith(f"service name {value!r} is not a valid DNS-1123 label: {reason}")


def test_dns_label_message_matches_kubernetes_wording() -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        ids.validate_dns_label("Book_Store", "service name")
    assert str(caught.value) == (
        "service name 'Book_Store' is not a valid DNS-1123 label: must consist of lower case "
        "alphanumeric characters or '-', and must start and end with an alphanumeric character"
    )


@pytest.mark.parametrize(
    "value",
    ["a", "cluster.local", "my-sa.v1", "a.b.c.d", ".".join(["a" * 63] * 3), "1.2.3.4"],
)
def test_valid_dns_subdomains_are_returned_unchanged(value: str) -> None:
    assert ids.validate_dns_subdomain(value, "cluster domain") == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must not be empty"),
        (".".join(["a" * 63] * 4), "must be no more than 253 characters, got 255"),
        ("Cluster.local", "must consist of lower case"),
        ("cluster..local", "must consist of lower case"),
        (".cluster.local", "must consist of lower case"),
        ("cluster.local.", "must consist of lower case"),
        ("cluster.-local", "must consist of lower case"),
        ("cluster_x.local", "must consist of lower case"),
        ("a" * 64 + ".local", "each dot-separated label must be no more than 63 characters"),
    ],
)
def test_invalid_dns_subdomains_name_field_and_reason(value: str, reason: str) -> None:
    with pytest.raises(InvalidIdentifier, match=r"^cluster domain .* DNS-1123 subdomain") as caught:
        ids.validate_dns_subdomain(value, "cluster domain")
    assert caught.value.field == "cluster domain"
    assert caught.value.reason.startswith(reason)


@pytest.mark.parametrize("value", ["example.org", "cluster.local", "my_domain-1.example", "td"])
def test_valid_trust_domains(value: str) -> None:
    assert ids.validate_trust_domain(value) == value


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "must not be empty"),
        ("a" * 256, "must be no more than 255 characters"),
        ("Example.org", "must consist of lower case letters"),
        ("example.org:8080", "must consist of lower case letters"),
        ("user@example.org", "must consist of lower case letters"),
    ],
)
def test_invalid_trust_domains(value: str, reason: str) -> None:
    with pytest.raises(InvalidIdentifier, match=r"^trust domain .* SPIFFE trust domain") as caught:
        ids.validate_trust_domain(value)
    assert caught.value.reason.startswith(reason)


def test_invalid_identifier_is_a_value_error_that_survives_pickling() -> None:
    err = InvalidIdentifier("namespace", "NS", "must be lower case", "DNS-1123 label")
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, InvalidIdentifier)
    assert (copy.field, copy.value, copy.reason, copy.kind) == (
        "namespace",
        "NS",
        "must be lower case",
        "DNS-1123 label",
    )
    assert str(copy) == str(err)


# --- proxy ids and proxy certificate common names -----------------------------------------


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("not-a-uuid", "must be a UUID"),
        ("", "must be a UUID"),
        (UUID.upper(), "must be in canonical form"),
        (UUID.replace("-", ""), "must be in canonical form"),
        ("{" + UUID + "}", "must be in canonical form"),
        ("urn:uuid:" + UUID, "must be in canonical form"),
    ],
)
def test_invalid_proxy_ids(value: str, reason: str) -> None:
    with pytest.raises(InvalidIdentifier, match=r"^proxy id ") as caught:
        ids.validate_proxy_id(value)
    assert caught.value.reason.startswith(reason)


@pytest.mark.parametrize(
    ("text", "service", "namespace"),
    [
        (f"{UUID}.bookstore.bookstore", "bookstore", "bookstore"),
        (f"{UUID}.bookstore-v1.default", "bookstore-v1", "default"),
        (f"{UUID}.a.b", "a", "b"),
        (f"{UUID}.{'s' * 13}.{'n' * 13}", "s" * 13, "n" * 13),  # exactly 64 characters
    ],
)
def test_proxy_common_name_parses_and_round_trips(text: str, service: str, namespace: str) -> None:
    cn = ProxyCommonName.parse(text)
    assert cn == ProxyCommonName(ProxyId(UUID), service, namespace)
    assert str(cn) == cn.format() == text
    assert ProxyCommonName.parse(str(cn)) == cn


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (f"{UUID}.bookstore", "must have 3 dot-separated parts, got 2"),
        (UUID, "must have 3 dot-separated parts, got 1"),
        (f"{UUID}.bookstore.bookstore.svc", "must have 3 dot-separated parts, got 4"),
        ("", "must have 3 dot-separated parts, got 1"),
        ("not-a-uuid.bookstore.default", "proxy id 'not-a-uuid' is not a valid UUID"),
        (f"{UUID.upper()}.bookstore.default", "proxy id"),
        (f"{UUID}.Book_Store.default", "service name 'Book_Store' is not a valid DNS-1123 label"),
        (f"{UUID}.bookstore.Default", "namespace 'Default' is not a valid DNS-1123 label"),
        (f"{UUID}.book_store.default", "service name 'book_store'"),
        (f"{UUID}..default", "service name '' is not a valid DNS-1123 label: must not be empty"),
        (f"{UUID}.{'s' * 14}.{'n' * 13}", "must be no more than 64 characters"),
        (f"{UUID}.bookstore-v1.bookstore-namespace", "got 69; service name and namespace"),
    ],
)
def test_invalid_proxy_common_names_name_the_cn_and_the_bad_part(text: str, fragment: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        ProxyCommonName.parse(text)
    err = caught.value
    assert (err.field, err.value) == ("proxy common name", text)
    assert str(err).startswith(f"proxy common name {text!r} is not a valid")
    assert fragment in str(err)


def test_proxy_common_name_constructor_validates_each_field() -> None:
    with pytest.raises(InvalidIdentifier, match=r"^namespace 'Default'") as caught:
        ProxyCommonName(ProxyId(UUID), "bookstore", "Default")
    assert caught.value.field == "namespace"


def test_new_proxy_common_name_has_a_fresh_uuid4_and_round_trips() -> None:
    first = ProxyCommonName.new("bookstore", "default")
    second = ProxyCommonName.new("bookstore", "default")
    assert first.proxy_id != second.proxy_id
    assert uuid.UUID(first.proxy_id).version == 4
    assert (first.service, first.namespace) == ("bookstore", "default")
    assert ProxyCommonName.parse(str(first)) == first


def test_new_proxy_common_name_refuses_names_too_long_for_a_cn() -> None:
    with pytest.raises(InvalidIdentifier, match="at most 26 characters"):
        ProxyCommonName.new("bookstore-service", "bookstore-ns")


# --- SPIFFE IDs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        (
            "spiffe://cluster.local/ns/default/sa/bookstore",
            ("cluster.local", "default", "bookstore"),
        ),
        (
            "spiffe://example.org/ns/bookstore/sa/bookstore-v1",
            ("example.org", "bookstore", "bookstore-v1"),
        ),
        ("spiffe://my_td-1/ns/a/sa/sa.with.dots", ("my_td-1", "a", "sa.with.dots")),
    ],
)
def test_spiffe_ids_parse_and_round_trip(uri: str, expected: tuple[str, str, str]) -> None:
    spiffe_id = SpiffeId.parse(uri)
    assert (spiffe_id.trust_domain, spiffe_id.namespace, spiffe_id.service_account) == expected
    assert spiffe_id.uri == str(spiffe_id) == uri
    assert SpiffeId.parse(str(SpiffeId(*expected))) == spiffe_id


@pytest.mark.parametrize(
    ("uri", "fragment"),
    [
        ("http://cluster.local/ns/default/sa/bookstore", "must start with 'spiffe://'"),
        ("SPIFFE://cluster.local/ns/default/sa/bookstore", "must start with 'spiffe://'"),
        ("cluster.local/ns/default/sa/bookstore", "must start with 'spiffe://'"),
        ("spiffe:///ns/default/sa/bookstore", "trust domain '' is not a valid"),
        ("spiffe://Cluster.local/ns/default/sa/bookstore", "trust domain 'Cluster.local'"),
        ("spiffe://cluster.local:8080/ns/default/sa/bookstore", "trust domain"),
        ("spiffe://cluster.local", "got no path"),
        ("spiffe://cluster.local/", "got '/'"),
        ("spiffe://cluster.local/ns/default", "got '/ns/default'"),
        ("spiffe://cluster.local/sa/bookstore/ns/default", "path must be '/ns/<namespace>/sa/"),
        ("spiffe://cluster.local/ns/default/sa/bookstore/extra", "path must be"),
        ("spiffe://cluster.local/ns/default/sa/bookstore/", "path must be"),
        ("spiffe://cluster.local/ns/Default/sa/bookstore", "namespace 'Default'"),
        ("spiffe://cluster.local/ns/default/sa/", "service account '' is not a valid"),
        ("spiffe://cluster.local/ns/default/sa/book?x=1", "service account 'book?x=1'"),
    ],
)
def test_invalid_spiffe_ids_name_the_id_and_the_bad_part(uri: str, fragment: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        SpiffeId.parse(uri)
    err = caught.value
    assert (err.field, err.value) == ("SPIFFE ID", uri)
    assert str(err).startswith(f"SPIFFE ID {uri!r} is not a valid 'spiffe://<trust-domain>/")
    assert fragment in str(err)


def test_spiffe_id_constructor_validates_each_field() -> None:
    with pytest.raises(InvalidIdentifier, match=r"^service account 'Book_Store'"):
        SpiffeId("cluster.local", "default", "Book_Store")


# --- service certificate common names and DNS names --------------------------------------


def test_service_common_name_format() -> None:
    cn = ServiceCommonName.for_service(MeshService("bookstore-ns", "bookstore"), "cluster.local")
    assert cn == ServiceCommonName("bookstore", "bookstore-ns", "cluster.local")
    assert str(cn) == cn.format() == "bookstore.bookstore-ns.svc.cluster.local"


@pytest.mark.parametrize(
    ("service", "namespace", "trust_domain", "field"),
    [
        ("Bookstore", "default", "cluster.local", "service name"),
        ("bookstore", "default_ns", "cluster.local", "namespace"),
        ("bookstore", "default", "Cluster.local", "trust domain"),
        ("bookstore", "default", "a" * 43, "service common name"),
    ],
)
def test_invalid_service_common_names_name_the_field(
    service: str, namespace: str, trust_domain: str, field: str
) -> None:
    with pytest.raises(InvalidIdentifier, match=f"^{field} ") as caught:
        ServiceCommonName(service, namespace, trust_domain)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "text", ["bookstore.shop.svc.cluster.local", "a.b.svc.svc", "a.b.svc.my_domain.example"]
)
def test_service_common_names_parse_and_round_trip(text: str) -> None:
    assert ServiceCommonName.parse(text).format() == text


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("bookstore.shop.cluster.local", "must have the form '<service>.<namespace>.svc."),
        ("bookstore.shop.svc", "must have the form"),
        ("bookstore.shop.svc.", "trust domain '' is not a valid SPIFFE trust domain"),
        ("Bookstore.shop.svc.cluster.local", "service name 'Bookstore' is not a valid"),
        ("b.s.svc." + "d" * 60, "must be no more than 64 characters"),
    ],
)
def test_invalid_service_common_names_name_the_cn_and_the_bad_part(
    text: str, fragment: str
) -> None:
    with pytest.raises(InvalidIdentifier, match=r"^service common name ") as caught:
        ServiceCommonName.parse(text)
    assert (caught.value.field, caught.value.value) == ("service common name", text)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("cluster_domain", "expected_last"),
    [
        (None, "bookstore.shop.svc.cluster.local"),
        ("cluster.local", "bookstore.shop.svc.cluster.local"),
        ("mesh.example.org", "bookstore.shop.svc.mesh.example.org"),
    ],
)
def test_service_dns_names(cluster_domain: str | None, expected_last: str) -> None:
    service = MeshService("shop", "bookstore")
    names = (
        ids.service_dns_names(service)
        if cluster_domain is None
        else ids.service_dns_names(service, cluster_domain)
    )
    assert names == ("bookstore", "bookstore.shop", "bookstore.shop.svc", expected_last)


def test_service_dns_names_refuses_an_invalid_cluster_domain() -> None:
    with pytest.raises(InvalidIdentifier, match=r"^cluster domain 'Cluster\.Local'"):
        ids.service_dns_names(MeshService("shop", "bookstore"), "Cluster.Local")
