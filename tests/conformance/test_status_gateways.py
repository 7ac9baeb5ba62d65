"""Upstream's Gateway conformance tests (v1.6.1, ``conformance/tests/gateway-*.go``) as
status checks at the catalog's domain level: the upstream manifests, parsed, resolved by
the :class:`PolicyBuilder`, and the statuses it answers compared as the Go test compares
them (see :mod:`tests.conformance.upstream`). One test per upstream test, named after it.
"""

from __future__ import annotations

from typing import Any

from tests.conformance.upstream import (
    HTTP_ROUTE,
    INFRA,
    Want,
    WantListener,
    assert_gateway_conditions,
    assert_listeners,
    assert_route_condition,
    build,
    build_raw,
    find,
    gateway_status,
    raw,
)
from trellis_catalog import gatewaystatus
from trellis_catalog.domain.routing.gateways import resolve_gateways
from trellis_spec.statuses import Status

RESOLVED = Want("ResolvedRefs", "True")
ACCEPTED = Want("Accepted", "True")


def test_gateway_invalid_route_kind() -> None:
    builder = build("gateway-invalid-route-kind")
    invalid = Want("ResolvedRefs", "False", "InvalidRouteKinds")
    only_invalid = gateway_status(builder, "gateway-only-invalid-route-kind")
    assert_listeners(only_invalid, [WantListener("http", (), (invalid,), 0)])
    both = gateway_status(builder, "gateway-supported-and-invalid-route-kind")
    assert_listeners(both, [WantListener("http", (HTTP_ROUTE,), (invalid,), 0)])


def test_gateway_secret_missing_reference_grant() -> None:
    builder = build("gateway-secret-missing-reference-grant")
    status = gateway_status(builder, "gateway-secret-missing-reference-grant")
    refused = Want("ResolvedRefs", "False", "RefNotPermitted")
    assert_listeners(status, [WantListener("https", (HTTP_ROUTE,), (refused,), 0)])


def test_gateway_secret_invalid_reference_grant() -> None:
    builder = build("gateway-secret-invalid-reference-grant")
    status = gateway_status(builder, "gateway-secret-invalid-reference-grant")
    refused = Want("ResolvedRefs", "False", "RefNotPermitted")
    assert_listeners(status, [WantListener("https", (HTTP_ROUTE,), (refused,), 0)])


def test_gateway_secret_reference_grant_all_in_namespace() -> None:
    builder = build("gateway-secret-reference-grant-all-in-namespace")
    status = gateway_status(builder, "gateway-secret-reference-grant-all-in-namespace")
    wanted = (Want("Programmed", "True", "Programmed"), RESOLVED)
    assert_listeners(status, [WantListener("https", (HTTP_ROUTE,), wanted, 0)])


def test_gateway_secret_reference_grant_specific() -> None:
    builder = build("gateway-secret-reference-grant-specific")
    status = gateway_status(builder, "gateway-secret-reference-grant-specific")
    wanted = (Want("Programmed", "True", "Programmed"), RESOLVED)
    assert_listeners(status, [WantListener("https", (HTTP_ROUTE,), wanted, 0)])


def test_gateway_invalid_listeners_unsupported_protocol() -> None:
    builder = build("gateway-invalid-listeners-unsupported-protocol")
    unsupported = WantListener(
        "invalid", (), (Want("Accepted", "False", "UnsupportedProtocol"),), 0
    )
    only = gateway_status(builder, "gateway-only-unsupported-protocols")
    assert_gateway_conditions(only, Want("Accepted", "False", "ListenersNotValid"))
    assert_listeners(only, [unsupported])
    mixed = gateway_status(builder, "gateway-supported-and-unsupported-protocols")
    assert_gateway_conditions(mixed, Want("Accepted", "True", "ListenersNotValid"))
    http = WantListener("http", (HTTP_ROUTE,), (Want("Accepted", "True", "Accepted"),), 0)
    assert_listeners(mixed, [http, unsupported])


def test_gateway_with_attached_routes() -> None:
    builder = build("gateway-with-attached-routes")
    one = gateway_status(builder, "gateway-with-one-attached-route")
    assert_listeners(one, [WantListener("http", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 1)])
    two = gateway_status(builder, "gateway-with-two-attached-routes")
    assert_listeners(two, [WantListener("http", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 2)])
    assert_route_condition(
        builder,
        ("HTTPRoute", INFRA, "http-route-not-accepted"),
        f"{INFRA}/gateway-with-two-attached-routes",
        Want("Accepted", "False", "NoMatchingListenerHostname"),
    )


def test_gateway_with_attached_routes_with_port_8080() -> None:
    builder = build("gateway-with-attached-routes-with-port-8080")
    status = gateway_status(builder, "gateway-with-two-listeners-and-one-attached-route")
    assert_listeners(
        status,
        [
            WantListener("http-unattached", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 0),
            WantListener("http", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 1),
        ],
    )


def test_gateway_modify_listeners() -> None:
    """Add a listener to one Gateway and remove one from another: the statuses follow the
    edited spec (upstream patches the objects; here the spec is built again)."""
    documents = raw("gateway-modify-listeners")
    added = find(documents, "Gateway", "gateway-add-listener")
    added["spec"]["listeners"].append(
        {
            "name": "http",
            "port": 80,
            "protocol": "HTTP",
            "hostname": "data.test.com",
            "allowedRoutes": {"namespaces": {"from": "All"}},
        }
    )
    removed = find(documents, "Gateway", "gateway-remove-listener")
    assert len(removed["spec"]["listeners"]) == 2
    removed["spec"]["listeners"] = [x for x in removed["spec"]["listeners"] if x["name"] == "http"]
    builder = build_raw(documents)
    assert_listeners(
        gateway_status(builder, "gateway-add-listener"),
        [
            WantListener("https", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 1),
            WantListener("http", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 1),
        ],
    )
    assert_listeners(
        gateway_status(builder, "gateway-remove-listener"),
        [WantListener("http", (HTTP_ROUTE,), (ACCEPTED, RESOLVED), 1)],
    )


def test_gateway_observed_generation_bump() -> None:
    """The status the catalog writes (:mod:`trellis_catalog.gatewaystatus`) carries the
    generation it was computed from: after a listener is added (generation 1 -> 2) every
    condition, the Gateway's and its listeners', observes generation 2."""
    name = "gateway-observed-generation-bump"
    documents = raw(name)
    gateway = find(documents, "Gateway", name)
    gateway["metadata"]["generation"] = 1
    first = gatewaystatus.status_of(gateway_status(build_raw(documents), name), gateway)
    assert first is not None
    assert _generations(first) == {1}
    gateway["status"] = first
    gateway["metadata"]["generation"] = 2
    gateway["spec"]["listeners"].append(
        {
            "name": "alternate",
            "hostname": "foo.com",
            "port": 80,
            "protocol": "HTTP",
            "allowedRoutes": {"namespaces": {"from": "All"}},
        }
    )
    second = gatewaystatus.status_of(gateway_status(build_raw(documents), name), gateway)
    assert second is not None
    assert _generations(second) == {2}
    assert [item["name"] for item in second["listeners"]][-1] == "alternate"


def _generations(status: dict[str, object]) -> set[object]:
    conditions = list(status["conditions"])  # type: ignore[call-overload]
    for listener in status.get("listeners") or []:  # type: ignore[attr-defined]
        conditions += listener["conditions"]
    return {c["observedGeneration"] for c in conditions}


def test_gateway_invalid_tls_configuration() -> None:
    """Four listeners whose certificateRefs cannot be used: each ResolvedRefs=False,
    InvalidCertificateRef, with HTTPRoute supported and no route attached."""
    builder = build("gateway-invalid-tls-configuration")
    invalid = WantListener(
        "https", (HTTP_ROUTE,), (Want("ResolvedRefs", "False", "InvalidCertificateRef"),), 0
    )
    for name in (
        "gateway-certificate-unsupported-group",
        "gateway-certificate-unsupported-kind",
    ):
        assert_listeners(gateway_status(builder, name), [invalid])


def test_gatewayclass_observed_generation_bump() -> None:
    """The GatewayClass's conditions as written observe its generation, after its
    description changes too (generation 1 -> 2)."""
    documents = raw(base=False)
    documents.append(
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "gatewayclass-observed-generation-bump", "generation": 1},
            "spec": {"controllerName": "trellis.dev/gateway", "description": "old"},
        }
    )
    gateway_class = documents[-1]
    key = "GatewayClass default/gatewayclass-observed-generation-bump"
    first = gatewaystatus.status_of(_class_status(documents, key), gateway_class)
    assert first is not None
    assert {(c["type"], c["status"], c["observedGeneration"]) for c in first["conditions"]} >= {
        ("Accepted", "True", 1)
    }
    gateway_class["status"] = first
    gateway_class["metadata"]["generation"] = 2
    gateway_class["spec"]["description"] = "new"
    second = gatewaystatus.status_of(_class_status(documents, key), gateway_class)
    assert second is not None
    assert {c["observedGeneration"] for c in second["conditions"]} == {2}


def _class_status(documents: list[dict[str, Any]], key: str) -> Status:
    """A class without Gateways: resolved directly (the builder resolves Gateways only
    when there are some)."""
    return resolve_gateways(build_raw(documents).spec).statuses[key]


def test_gateway_invalid_parameters_ref() -> None:
    """gateway-invalid-parameters-ref.go (core): a Gateway whose
    ``spec.infrastructure.parametersRef`` names an object the implementation does not take
    is Accepted=False, InvalidParameters."""
    builder = build("gateway-invalid-parameters-ref")
    status = gateway_status(builder, "gateway-invalid-parameters-ref")
    assert_gateway_conditions(status, Want("Accepted", "False", "InvalidParameters"))
