"""Fuzzing the identifier, CN and SPIFFE parsers: round trips, and clean refusals of junk.

Valid identifiers survive ``parse(format(x)) == x``; any text given to a parser or a
validator comes back unchanged or raises ``InvalidIdentifier`` naming the field, quoting
the value and giving a reason; nothing else escapes. The request checks built on them
(:mod:`trellis_runtime.grpcrequests`) answer the same way with ``InvalidField``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from trellis_common import ids, model
from trellis_runtime import grpcrequests
from trellis_testing import strategies as fuzz

TEXT = fuzz.mostly(fuzz.plausible_names(), fuzz.names()) | st.text(max_size=100)


def refused(exc: ids.InvalidIdentifier, field: str, value: str) -> None:
    assert exc.field == field
    assert exc.value == value
    assert exc.reason
    assert str(exc).startswith(f"{field} {value!r} is not a valid {exc.kind}: ")


@given(
    proxy=fuzz.proxy_ids(),
    service=fuzz.dns_labels(),
    namespace=fuzz.dns_labels(),
)
def test_proxy_common_names_round_trip_or_say_they_are_too_long(
    proxy: ids.ProxyId, service: str, namespace: str
) -> None:
    text = f"{proxy}.{service}.{namespace}"
    if len(text) > ids.MAX_COMMON_NAME_LENGTH:
        with pytest.raises(ids.InvalidIdentifier, match=r"^proxy common name "):
            ids.ProxyCommonName(proxy, service, namespace)
        return
    cn = ids.ProxyCommonName(proxy, service, namespace)
    assert cn.format() == text
    assert ids.ProxyCommonName.parse(text) == cn


@given(service=fuzz.dns_labels(), namespace=fuzz.dns_labels(), domain=fuzz.trust_domains())
def test_service_common_names_round_trip_or_say_they_are_too_long(
    service: str, namespace: str, domain: str
) -> None:
    text = f"{service}.{namespace}.svc.{domain}"
    if len(text) > ids.MAX_COMMON_NAME_LENGTH:
        with pytest.raises(ids.InvalidIdentifier, match=r"^service common name "):
            ids.ServiceCommonName(service, namespace, domain)
        return
    cn = ids.ServiceCommonName(service, namespace, domain)
    assert cn.format() == text
    assert ids.ServiceCommonName.parse(text) == cn


@given(domain=fuzz.trust_domains(), namespace=fuzz.dns_labels(), account=fuzz.dns_subdomains())
def test_spiffe_ids_round_trip(domain: str, namespace: str, account: str) -> None:
    spiffe = ids.SpiffeId(domain, namespace, account)
    assert ids.SpiffeId.parse(spiffe.uri) == spiffe
    assert model.ServiceAccount(namespace, account).spiffe_id(domain) == spiffe


@given(namespace=fuzz.dns_labels(), name=fuzz.dns_labels())
def test_namespaced_names_round_trip(namespace: str, name: str) -> None:
    service = model.MeshService(namespace, name)
    assert model.MeshService.parse(str(service)) == service
    assert model.ServiceAccount.parse(f"{namespace}/{name}").name == name
    assert ids.service_dns_names(service)[-1] == f"{name}.{namespace}.svc.cluster.local"


PARSERS: list[tuple[str, Callable[[str], Any]]] = [
    ("proxy common name", ids.ProxyCommonName.parse),
    ("service common name", ids.ServiceCommonName.parse),
    ("SPIFFE ID", ids.SpiffeId.parse),
    ("mesh service", model.MeshService.parse),
    ("service account", model.ServiceAccount.parse),
]


@pytest.mark.parametrize(("field", "parse"), PARSERS, ids=[f for f, _ in PARSERS])
@given(text=TEXT)
@example(text="spiffe://")
@example(text="spiffe://td/ns/a/sa/b/")
@example(text="a.b.svc.")
@example(text="/")
def test_parsers_take_any_text_or_refuse_it_naming_the_field(
    field: str, parse: Callable[[str], Any], text: str
) -> None:
    try:
        parsed = parse(text)
    except ids.InvalidIdentifier as exc:
        error = exc
    else:
        assert str(parsed) == text
        return
    assert str(error).startswith(f"{error.field} {error.value!r} is not a valid ")
    if field not in ("mesh service", "service account"):  # these name the bad half
        refused(error, field, text)


VALIDATORS: list[Callable[[str, str], str]] = [
    ids.validate_dns_label,
    ids.validate_dns_subdomain,
    ids.validate_trust_domain,
    ids.validate_proxy_id,
]


@pytest.mark.parametrize("validate", VALIDATORS, ids=[v.__name__ for v in VALIDATORS])
@given(text=TEXT)
@example(text="a" * 64)
@example(text="a." * 127 + "a")
@example(text="\u0661" * 32)  # Arabic-Indic digits: int() reads them, a UUID has none
def test_validators_return_the_value_or_refuse_it_naming_the_field(
    validate: Callable[[str, str], str], text: str
) -> None:
    try:
        valid = validate(text, "the field")
    except ids.InvalidIdentifier as exc:
        refused(exc, "the field", text)
    else:
        assert valid == text


CHECKS: list[Callable[[str, str], Any]] = [
    grpcrequests.dns_label,
    grpcrequests.dns_subdomain,
    grpcrequests.service_account,
    grpcrequests.proxy_id,
    grpcrequests.proxy_common_name,
    grpcrequests.common_name,
    grpcrequests.namespaced,
    grpcrequests.ip_address,
    grpcrequests.text,
]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
@given(text=TEXT)
def test_request_checks_refuse_with_the_request_field_and_a_short_message(
    check: Callable[[str, str], Any], text: str
) -> None:
    try:
        check("service.name", text)
    except grpcrequests.InvalidField as exc:
        error = exc
    else:
        return
    assert error.field == "service.name"
    assert str(error).startswith("service.name: ")
    assert len(str(error)) < 600


@given(uuid=st.uuids())
def test_only_canonical_uuids_are_proxy_ids(uuid: Any) -> None:
    text = str(uuid)
    assert ids.validate_proxy_id(text) == text
    for other in (text.upper(), uuid.hex, f"{{{text}}}", f"urn:uuid:{text}"):
        assume(other != text)
        with pytest.raises(ids.InvalidIdentifier, match="proxy id"):
            ids.validate_proxy_id(other)
