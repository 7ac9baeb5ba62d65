"""The shared request checks: messages name the request's field; refusals are counted."""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_common.ids import ProxyCommonName, ServiceCommonName
from trellis_runtime import grpcrequests as check
from trellis_runtime.grpcrequests import InvalidField, RequestGate, rpc
from trellis_runtime.health import Health
from trellis_testing.servicer import Aborted, FakeServicerContext

UUID = "123e4567-e89b-42d3-a456-426614174000"


@pytest.mark.parametrize(
    ("validate", "value"),
    [
        (check.dns_label, "bookstore"),
        (check.dns_subdomain, "book.store"),
        (check.service_account, "bookstore-sa"),
        (check.proxy_id, UUID),
        (check.ip_address, "10.0.0.1"),
        (check.text, "proxy-cp-1"),
    ],
)
def test_valid_values_come_back_unchanged(validate: Callable[[str, str], str], value: str) -> None:
    assert validate("field", value) == value


@pytest.mark.parametrize(
    ("validate", "value", "reason"),
    [
        (check.dns_label, "", "is required"),
        (check.dns_label, "Bad Name!", "'Bad Name!' is not a valid DNS-1123 label: must consist"),
        (check.dns_subdomain, "a..b", "'a..b' is not a valid DNS-1123 subdomain"),
        (check.service_account, "Bad Name!", "'Bad Name!' is not a valid DNS-1123 subdomain"),
        (check.proxy_id, "123", "'123' is not a valid UUID"),
        (check.proxy_id, UUID.upper(), "must be in canonical form"),
        (check.ip_address, "10.0.0.300", "must be an IP address, got '10.0.0.300'"),
        (check.text, "two words", "must be printable with no spaces"),
        (check.text, "x" * 254, "must be no more than 253 characters, got 254"),
        (check.required, "", "is required"),
    ],
)
def test_invalid_values_name_the_field_and_the_rule(
    validate: Callable[[str, str], str], value: str, reason: str
) -> None:
    with pytest.raises(InvalidField) as caught:
        validate("service.name", value)
    assert caught.value.field == "service.name"
    assert str(caught.value).startswith("service.name: ")
    assert reason in str(caught.value)


def test_optional_values_may_be_empty_and_are_still_checked_when_given() -> None:
    assert check.dns_label("namespace", "", optional=True) == ""
    assert check.service_account("service_account", "") == ""
    assert check.proxy_id("proxy_id", "", optional=True) == ""
    assert check.ip_address("address", "", optional=True) == ""
    with pytest.raises(InvalidField, match=r"^service_account: 'Bad Name!' is not"):
        check.service_account("service_account", "Bad Name!")
    with pytest.raises(InvalidField, match=r"^source_service_account: is required"):
        check.service_account("source_service_account", "", optional=False)


def test_long_values_are_not_echoed_whole() -> None:
    with pytest.raises(InvalidField) as caught:
        check.dns_label("namespace", "a" * 10_000)
    assert len(str(caught.value)) < 300
    assert "aaaa...'" in str(caught.value)


def test_common_names_of_both_kinds_parse() -> None:
    proxy = check.common_name("common_name", f"{UUID}.bookstore.shop")
    assert proxy == ProxyCommonName.parse(f"{UUID}.bookstore.shop")
    service = check.common_name("common_name", "bookstore.shop.svc.cluster.local")
    assert service == ServiceCommonName("bookstore", "shop", "cluster.local")


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("", "is required"),
        ("nope", "'nope' is not a certificate common name: must be '<proxy-uuid>."),
        (f"{UUID}.Bad_Name.shop", "is not a valid '<proxy-uuid>.<service>.<namespace>' common"),
        ("123.bookstore.shop", "proxy id '123' is not a valid UUID"),
        ("bookstore.Shop.svc.cluster.local", "namespace 'Shop' is not a valid DNS-1123 label"),
        ("b.s.svc." + "d" * 60, "must be no more than 64 characters"),
    ],
)
def test_bad_common_names_say_what_a_common_name_is(value: str, reason: str) -> None:
    with pytest.raises(InvalidField) as caught:
        check.common_name("common_name", value)
    assert str(caught.value).startswith("common_name: ")
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("shop", "must be '<namespace>/<name>', got 'shop'"),
        ("shop/a/b", "must be '<namespace>/<name>'"),
        ("/api", "is required"),
        ("shop/Bad Name!", "'Bad Name!' is not a valid DNS-1123 label"),
    ],
)
def test_namespaced_names_check_both_halves(value: str, reason: str) -> None:
    assert check.namespaced("identity", "shop/api") == ("shop", "api")
    with pytest.raises(InvalidField, match=r"^identity: ") as caught:
        check.namespaced("identity", value)
    assert reason in str(caught.value)


def test_enums_must_be_named_values() -> None:
    allowed = {1: "SERVICE", 2: "PROXY"}
    assert check.enum("kind", 2, allowed) == 2
    with pytest.raises(InvalidField, match=r"^kind: must be one of SERVICE, PROXY, got 0$"):
        check.enum("kind", 0, allowed)


async def test_the_gate_records_counts_logs_and_aborts_with_invalid_argument(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = CollectorRegistry()
    health = Health(metrics)
    gate = RequestGate(health.rejections)
    context = FakeServicerContext()
    caplog.set_level(logging.WARNING)
    error = InvalidField("service_account", "'Bad Name!' is not a valid DNS-1123 subdomain")

    for _ in range(2):
        with pytest.raises(Aborted):
            await gate.refuse(context, "IssueCertificate", error)  # type: ignore[arg-type]

    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert context.details == str(error)
    [item] = health.rejections.items()
    assert (item.source, item.key, item.reason, item.count) == (
        "grpc",
        "IssueCertificate",
        str(error),
        2,
    )
    assert metrics.get_sample_value("trellis_rejected_records_total", {"source": "grpc"}) == 2
    logged = [r.getMessage() for r in caplog.records if "record.rejected" in r.getMessage()]
    assert len(logged) == 1
    assert "IssueCertificate" in logged[0]
    assert "service_account" in logged[0]


async def test_the_gate_check_returns_what_the_check_returns_or_refuses() -> None:
    health = Health(CollectorRegistry())
    gate = RequestGate(health.rejections)
    context = FakeServicerContext()

    assert await gate.check(context, "ListServices", _namespace, "shop") == "shop"  # type: ignore[arg-type]
    with pytest.raises(Aborted):
        await gate.check(context, "ListServices", _namespace, "Bad!")  # type: ignore[arg-type]
    assert context.code == grpc.StatusCode.INVALID_ARGUMENT
    assert context.details.startswith("namespace: 'Bad!' is not a valid DNS-1123 label")
    [item] = health.rejections.items()
    assert (item.key, item.count) == ("ListServices", 1)


async def test_the_gate_check_refuses_the_errors_it_is_told_are_bad_requests() -> None:
    gate = RequestGate()
    context = FakeServicerContext()

    def domain_check(request: str) -> str:
        raise LookupError(f"no {request}")

    with pytest.raises(Aborted):
        await gate.check(context, "Get", domain_check, "x", (LookupError,))  # type: ignore[arg-type]
    assert (context.code, context.details) == (grpc.StatusCode.INVALID_ARGUMENT, "no x")
    with pytest.raises(LookupError):
        await gate.check(FakeServicerContext(), "Get", domain_check, "x")  # type: ignore[arg-type]


def _namespace(request: str) -> str:
    return check.dns_label("namespace", request)


class _Servicer:
    """A servicer with one checked RPC, its domain errors mapped as a real one maps them."""

    def __init__(self) -> None:
        self.gate = RequestGate()

    @rpc(
        _namespace,
        refused=(InvalidField, ValueError),
        statuses={LookupError: grpc.StatusCode.NOT_FOUND},
    )
    async def Get(self, namespace: str, context: object) -> str:
        if namespace == "gone":
            raise LookupError("no namespace gone")
        if namespace == "odd":
            raise ValueError("odd is refused by the domain")
        if namespace == "boom":
            raise RuntimeError("a bug")
        return f"answer for {namespace}"


@pytest.mark.parametrize(
    ("request_", "code", "details"),
    [
        ("Bad!", grpc.StatusCode.INVALID_ARGUMENT, "namespace: 'Bad!' is not a valid DNS-1123"),
        ("odd", grpc.StatusCode.INVALID_ARGUMENT, "odd is refused by the domain"),
        ("gone", grpc.StatusCode.NOT_FOUND, "no namespace gone"),
    ],
)
async def test_an_rpc_refuses_bad_requests_and_maps_domain_errors_to_statuses(
    request_: str, code: grpc.StatusCode, details: str
) -> None:
    servicer = _Servicer()
    context = FakeServicerContext()
    with pytest.raises(Aborted):
        await servicer.Get(request_, context)  # type: ignore[arg-type]
    assert context.code == code
    assert context.details.startswith(details)
    refused = [item.key for item in servicer.gate.rejections.items()]
    assert refused == (["Get"] if code == grpc.StatusCode.INVALID_ARGUMENT else [])


async def test_an_rpc_answers_with_checked_values_and_lets_bugs_through() -> None:
    servicer = _Servicer()
    assert await servicer.Get("shop", FakeServicerContext()) == "answer for shop"  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="a bug"):
        await servicer.Get("boom", FakeServicerContext())  # type: ignore[arg-type]
