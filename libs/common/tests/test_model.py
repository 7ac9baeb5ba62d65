"""Tests for trellis_common.model: the frozen domain types and their validation."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from trellis_common.ids import InvalidIdentifier, SpiffeId
from trellis_common.model import (
    ClusterName,
    Endpoint,
    InvalidModel,
    MeshService,
    RoutePolicy,
    ServiceAccount,
    TrafficPolicy,
    TrafficResource,
    TrafficTarget,
    WeightedCluster,
    WeightedService,
)

BOOKSTORE = MeshService("bookstore", "bookstore-v1")
BOOKSTORE_SA = ServiceAccount("bookstore", "bookstore")
BOOKBUYER_SA = ServiceAccount("bookbuyer", "bookbuyer")
ROUTE = RoutePolicy("/books.*", ("GET",))


def test_values_are_frozen_and_hashable() -> None:
    values = {BOOKSTORE, MeshService("bookstore", "bookstore-v1"), BOOKSTORE_SA, ROUTE}
    assert len(values) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        BOOKSTORE.name = "other"  # type: ignore[misc]
    target = TrafficTarget("t", "bookstore", BOOKSTORE_SA, (BOOKBUYER_SA,), (ROUTE,))
    assert hash(target) == hash(dataclasses.replace(target))


# --- services and service accounts ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "namespace", "name"),
    [("bookstore/bookstore-v1", "bookstore", "bookstore-v1"), ("default/a", "default", "a")],
)
def test_mesh_service_parse_and_str_round_trip(text: str, namespace: str, name: str) -> None:
    service = MeshService.parse(text)
    assert service == MeshService(namespace, name)
    assert str(service) == text


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("bookstore", "mesh service"),
        ("a/b/c", "mesh service"),
        ("/bookstore", "namespace"),
        ("bookstore/", "service name"),
        ("Bookstore/bookstore", "namespace"),
        ("bookstore/Book_Store", "service name"),
        ("bookstore/book.store", "service name"),
    ],
)
def test_invalid_mesh_services_name_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidIdentifier, match=f"^{field} ") as caught:
        MeshService.parse(text)
    assert caught.value.field == field


def test_service_account_allows_dotted_names_and_round_trips() -> None:
    account = ServiceAccount.parse("bookstore/bookstore.v1")
    assert account == ServiceAccount("bookstore", "bookstore.v1")
    assert str(account) == "bookstore/bookstore.v1"


@pytest.mark.parametrize(
    ("namespace", "name", "field"),
    [
        ("Bookstore", "bookstore", "namespace"),
        ("book.store", "bookstore", "namespace"),
        ("bookstore", "Book_Store", "service account"),
        ("bookstore", "", "service account"),
    ],
)
def test_invalid_service_accounts_name_the_field(namespace: str, name: str, field: str) -> None:
    with pytest.raises(InvalidIdentifier, match=f"^{field} "):
        ServiceAccount(namespace, name)


def test_service_account_spiffe_id() -> None:
    spiffe_id = BOOKSTORE_SA.spiffe_id("cluster.local")
    assert spiffe_id == SpiffeId("cluster.local", "bookstore", "bookstore")
    assert str(spiffe_id) == "spiffe://cluster.local/ns/bookstore/sa/bookstore"


def test_service_account_spiffe_id_refuses_a_bad_trust_domain() -> None:
    with pytest.raises(InvalidIdentifier, match=r"^trust domain 'Cluster\.Local'"):
        BOOKSTORE_SA.spiffe_id("Cluster.Local")


# --- endpoints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ip", "port", "normalized_ip", "text"),
    [
        ("10.0.0.1", 8080, "10.0.0.1", "10.0.0.1:8080"),
        ("::1", 1, "::1", "[::1]:1"),
        ("2001:DB8:0:0::0001", 65535, "2001:db8::1", "[2001:db8::1]:65535"),
    ],
)
def test_endpoints_normalize_the_ip(ip: str, port: int, normalized_ip: str, text: str) -> None:
    endpoint = Endpoint(ip, port)
    assert endpoint.ip == normalized_ip
    assert endpoint == Endpoint(normalized_ip, port)
    assert str(endpoint) == text


@pytest.mark.parametrize(
    ("ip", "port", "field", "reason"),
    [
        ("10.0.0.256", 80, "endpoint ip", "must be an IPv4 or IPv6 address"),
        ("bookstore.local", 80, "endpoint ip", "must be an IPv4 or IPv6 address"),
        ("", 80, "endpoint ip", "must be an IPv4 or IPv6 address"),
        ("010.0.0.1", 80, "endpoint ip", "must be an IPv4 or IPv6 address"),
        (167772161, 80, "endpoint ip", "must be a string"),
        ("10.0.0.1", 0, "endpoint port", "must be between 1 and 65535"),
        ("10.0.0.1", 65536, "endpoint port", "must be between 1 and 65535"),
        ("10.0.0.1", -1, "endpoint port", "must be between 1 and 65535"),
        ("10.0.0.1", "80", "endpoint port", "must be an integer"),
        ("10.0.0.1", True, "endpoint port", "must be an integer"),
    ],
)
def test_invalid_endpoints_name_the_field(ip: Any, port: Any, field: str, reason: str) -> None:
    with pytest.raises(InvalidModel, match=f"^{field} ") as caught:
        Endpoint(ip, port)
    assert (caught.value.field, caught.value.reason) == (field, reason)


# --- weights -----------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [0, 1, 100, 2**32 - 1])
def test_valid_weights(weight: int) -> None:
    assert WeightedService(BOOKSTORE, weight).weight == weight
    assert WeightedCluster(ClusterName("bookstore/bookstore-v1"), weight).weight == weight


@pytest.mark.parametrize(
    ("weight", "reason"),
    [
        (-1, "must be between 0 and 4294967295"),
        (2**32, "must be between 0 and 4294967295"),
        (1.5, "must be an integer"),
        ("10", "must be an integer"),
        (False, "must be an integer"),
    ],
)
def test_invalid_weights_name_the_field(weight: Any, reason: str) -> None:
    for build in (
        lambda: WeightedService(BOOKSTORE, weight),
        lambda: WeightedCluster(ClusterName("c"), weight),
    ):
        with pytest.raises(InvalidModel, match=r"^weight ") as caught:
            build()
        assert caught.value.reason == reason


def test_weighted_service_needs_a_mesh_service() -> None:
    with pytest.raises(InvalidModel, match=r"^service 'bookstore/bookstore-v1'.*MeshService"):
        WeightedService("bookstore/bookstore-v1", 10)  # type: ignore[arg-type]


def test_weighted_cluster_needs_a_cluster_name() -> None:
    with pytest.raises(InvalidModel, match=r"^cluster name '' .*non-empty"):
        WeightedCluster(ClusterName(""), 10)


# --- route policies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path_regex", "methods", "headers"),
    [
        ("/books.*", ("GET",), ()),
        ("", ("*",), ()),
        (".*", ("GET", "POST", "PATCH"), (("user-agent", ".*Mozilla.*"),)),
        ("/api/v[0-9]+/", ("*", "GET"), (("x-version", "2"), ("X-Tenant", "a"))),
    ],
)
def test_valid_route_policies(
    path_regex: str, methods: tuple[str, ...], headers: tuple[tuple[str, str], ...]
) -> None:
    route = RoutePolicy(path_regex, methods, headers)
    assert (route.path_regex, route.methods, route.headers) == (path_regex, methods, headers)


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        ({"path_regex": "/books(", "methods": ("GET",)}, "path regex", "does not compile"),
        ({"path_regex": "*", "methods": ("GET",)}, "path regex", "does not compile"),
        ({"path_regex": ".*", "methods": ()}, "methods", "at least one method"),
        ({"path_regex": ".*", "methods": ["GET"]}, "methods", "must be a tuple of str"),
        ({"path_regex": ".*", "methods": "GET"}, "methods", "must be a tuple of str"),
        ({"path_regex": ".*", "methods": ("get",)}, "method", "must be '*' or one of"),
        ({"path_regex": ".*", "methods": ("FETCH",)}, "method", "CONNECT, DELETE, GET"),
        ({"path_regex": ".*", "methods": (1,)}, r"methods\[0\]", "must be a str"),
        (
            {"path_regex": ".*", "methods": ("GET",), "headers": (("a", "b", "c"),)},
            "header",
            "(name, value) pair",
        ),
        (
            {"path_regex": ".*", "methods": ("GET",), "headers": (("", "b"),)},
            "header name",
            "non-empty HTTP token",
        ),
        (
            {"path_regex": ".*", "methods": ("GET",), "headers": (("bad header", "b"),)},
            "header name",
            "HTTP token",
        ),
        (
            {"path_regex": ".*", "methods": ("GET",), "headers": [("a", "b")]},
            "headers",
            "must be a tuple",
        ),
    ],
)
def test_invalid_route_policies_name_the_field(
    kwargs: dict[str, Any], field: str, fragment: str
) -> None:
    with pytest.raises(InvalidModel, match=f"^{field} ") as caught:
        RoutePolicy(**kwargs)
    assert fragment in caught.value.reason


# --- traffic targets and policies ----------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "name"),
    [("Service", "bookstore-v1"), ("ServiceAccount", "bookstore"), ("ServiceAccount", "sa.v1")],
)
def test_valid_traffic_resources(kind: Any, name: str) -> None:
    resource = TrafficResource(kind, "bookstore", name)
    assert (resource.kind, resource.namespace, resource.name) == (kind, "bookstore", name)


@pytest.mark.parametrize(
    ("kind", "namespace", "name", "error", "field"),
    [
        ("Pod", "bookstore", "bookstore", InvalidModel, "traffic resource kind"),
        ("service", "bookstore", "bookstore", InvalidModel, "traffic resource kind"),
        ("Service", "Bookstore", "bookstore", InvalidIdentifier, "namespace"),
        ("Service", "bookstore", "book.store", InvalidIdentifier, "service name"),
        ("ServiceAccount", "bookstore", "Book_Store", InvalidIdentifier, "service account"),
    ],
)
def test_invalid_traffic_resources_name_the_field(
    kind: Any, namespace: str, name: str, error: type[ValueError], field: str
) -> None:
    with pytest.raises(error, match=f"^{field} "):
        TrafficResource(kind, namespace, name)


def test_traffic_target_holds_its_parts() -> None:
    target = TrafficTarget("bookstore-access", "bookstore", BOOKSTORE_SA, (BOOKBUYER_SA,), (ROUTE,))
    assert target.destination == BOOKSTORE_SA
    assert target.sources == (BOOKBUYER_SA,)
    assert target.routes == (ROUTE,)


@pytest.mark.parametrize(
    ("overrides", "error", "field"),
    [
        ({"name": "Bookstore_Access"}, InvalidIdentifier, "traffic target name"),
        ({"namespace": "Bookstore"}, InvalidIdentifier, "namespace"),
        ({"namespace": "other"}, InvalidModel, "destination namespace"),
        ({"destination": "bookstore/bookstore"}, InvalidModel, "destination"),
        ({"sources": [BOOKBUYER_SA]}, InvalidModel, "sources"),
        ({"sources": (BOOKBUYER_SA, "bookbuyer/x")}, InvalidModel, r"sources\[1\]"),
        ({"routes": ("/books",)}, InvalidModel, r"routes\[0\]"),
    ],
)
def test_invalid_traffic_targets_name_the_field(
    overrides: dict[str, Any], error: type[ValueError], field: str
) -> None:
    fields: dict[str, Any] = {
        "name": "bookstore-access",
        "namespace": "bookstore",
        "destination": BOOKSTORE_SA,
        "sources": (BOOKBUYER_SA,),
        "routes": (ROUTE,),
    }
    with pytest.raises(error, match=f"^{field} "):
        TrafficTarget(**(fields | overrides))


def test_traffic_policy_holds_its_parts() -> None:
    destination = TrafficResource("ServiceAccount", "bookstore", "bookstore")
    source = TrafficResource("ServiceAccount", "bookbuyer", "bookbuyer")
    policy = TrafficPolicy("bookstore-access", destination, source, (ROUTE,))
    assert policy.destination == destination
    assert policy.source == source
    assert policy.route_paths == (ROUTE,)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"policy_name": ""}, "policy name"),
        ({"destination": BOOKSTORE_SA}, "destination"),
        ({"source": None}, "source"),
        ({"route_paths": [ROUTE]}, "route paths"),
        ({"route_paths": (ROUTE, "/x")}, r"route paths\[1\]"),
    ],
)
def test_invalid_traffic_policies_name_the_field(overrides: dict[str, Any], field: str) -> None:
    resource = TrafficResource("ServiceAccount", "bookstore", "bookstore")
    fields: dict[str, Any] = {
        "policy_name": "p",
        "destination": resource,
        "source": resource,
        "route_paths": (ROUTE,),
    }
    with pytest.raises(InvalidModel, match=f"^{field} "):
        TrafficPolicy(**(fields | overrides))


def test_invalid_model_survives_pickling() -> None:
    err = InvalidModel("weight", -1, "must not be negative")
    copy = pickle.loads(pickle.dumps(err))
    assert isinstance(copy, InvalidModel)
    assert (copy.field, copy.value, copy.reason, str(copy)) == (
        "weight",
        -1,
        "must not be negative",
        "weight -1 is not valid: must not be negative",
    )
