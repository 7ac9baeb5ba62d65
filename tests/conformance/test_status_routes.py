"""Upstream's HTTPRoute and GRPCRoute conformance tests (v1.6.1,
``conformance/tests/{http,grpc}route-*.go``): their status assertions at the catalog's
domain level, one test per upstream test, named after it. What their requests expect is
checked against a real Envoy in the ``test_traffic_*`` modules; for the invalid references
here, the view's answer (500 for the invalid share) is checked in the view too.
"""

from __future__ import annotations

from tests.conformance.upstream import (
    HTTP_ROUTE,
    INFRA,
    Want,
    WantListener,
    assert_accepted,
    assert_listeners,
    assert_no_accepted_parents,
    assert_route_condition,
    build,
    build_raw,
    find,
    gateway_status,
    raw,
    route_status,
)
from trellis_catalog import routestatus
from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.model.views import Identity, Route

WEB = "gateway-conformance-web-backend"
SAME = f"{INFRA}/same-namespace"
RESOLVED = Want("ResolvedRefs", "True", "ResolvedRefs")


def http(name: str, namespace: str = INFRA) -> tuple[str, str, str]:
    return ("HTTPRoute", namespace, name)


def routes_of(builder: PolicyBuilder, gateway: str = "same-namespace") -> list[Route]:
    """The routes of the gateway's only port's only server's catch-all host."""
    (port,) = builder.build(Identity(INFRA, gateway), gateway).gateway
    (server,) = port.servers
    return [r for v in server.virtual_hosts for r in v.routes if r.name != "no-route"]


def zero_routes(builder: PolicyBuilder, gateway: str = "same-namespace") -> None:
    """upstream's ``GatewayMustHaveZeroRoutes``: no listener, or one with none attached."""
    listeners = gateway_status(builder, gateway).listeners
    assert not listeners or (len(listeners) == 1 and listeners[0].attached_routes == 0)


def test_httproute_simple_same_namespace() -> None:
    builder = build("httproute-simple-same-namespace")
    assert_accepted(builder, SAME, [http("gateway-conformance-infra-test")])
    assert_route_condition(builder, http("gateway-conformance-infra-test"), SAME, RESOLVED)


def test_httproute_cross_namespace() -> None:
    builder = build("httproute-cross-namespace")
    gateway = f"{INFRA}/backend-namespaces"
    assert_accepted(builder, gateway, [http("cross-namespace", WEB)])
    assert_route_condition(builder, http("cross-namespace", WEB), gateway, RESOLVED)


def test_httproute_invalid_cross_namespace_parent_ref() -> None:
    builder = build("httproute-invalid-cross-namespace-parent-ref")
    route = http("invalid-cross-namespace-parent-ref", WEB)
    assert_route_condition(builder, route, SAME, RESOLVED)
    assert_route_condition(builder, route, SAME, Want("Accepted", "False", "NotAllowedByListeners"))
    assert_no_accepted_parents(builder, *route)
    zero_routes(builder)


def test_httproute_invalid_cross_namespace_backend_ref() -> None:
    builder = build("httproute-invalid-cross-namespace-backend-ref")
    route = http("invalid-cross-namespace-backend-ref")
    assert_accepted(builder, SAME, [route])
    assert_route_condition(builder, route, SAME, Want("ResolvedRefs", "False", "RefNotPermitted"))
    assert [r.direct_status for r in routes_of(builder)] == [500]


def test_httproute_invalid_backendref_unknown_kind() -> None:
    builder = build("httproute-invalid-backendref-unknown-kind")
    route = http("invalid-backend-ref-unknown-kind")
    assert_accepted(builder, SAME, [route])
    assert_route_condition(builder, route, SAME, Want("ResolvedRefs", "False", "InvalidKind"))
    assert [r.direct_status for r in routes_of(builder)] == [500]


def test_httproute_invalid_nonexistent_backendref() -> None:
    builder = build("httproute-invalid-nonexistent-backendref")
    route = http("invalid-nonexistent-backend-ref")
    assert_accepted(builder, SAME, [route])
    assert_route_condition(builder, route, SAME, Want("ResolvedRefs", "False", "BackendNotFound"))
    assert [r.direct_status for r in routes_of(builder)] == [500]


def test_httproute_invalid_parentref_not_matching_listener_port() -> None:
    builder = build("httproute-invalid-parentref-not-matching-listener-port")
    route = http("httproute-listener-not-matching-route-port")
    assert_route_condition(builder, route, SAME, RESOLVED)
    assert_route_condition(builder, route, SAME, Want("Accepted", "False", "NoMatchingParent"))
    assert_no_accepted_parents(builder, *route)
    zero_routes(builder)


def test_httproute_invalid_parentref_not_matching_section_name() -> None:
    builder = build("httproute-invalid-parentref-not-matching-section-name")
    route = http("httproute-listener-not-matching-section-name")
    assert_route_condition(builder, route, SAME, Want("Accepted", "False", "NoMatchingParent"))
    assert_no_accepted_parents(builder, *route)
    zero_routes(builder)


def test_httproute_invalid_parentref_section_name_not_matching_port() -> None:
    builder = build("httproute-invalid-parentref-section-name-not-matching-port")
    route = http("httproute-listener-section-name-not-matching-port")
    gateway = "gateway-with-one-not-matching-port-and-section-name-route"
    wanted = Want("Accepted", "False", "NoMatchingParent")
    assert_route_condition(builder, route, f"{INFRA}/{gateway}", wanted)
    assert_no_accepted_parents(builder, *route)
    zero_routes(builder, gateway)


def test_httproute_invalid_reference_grant() -> None:
    builder = build("httproute-invalid-reference-grant")
    route = http("reference-grant")
    assert_accepted(builder, SAME, [route])
    assert_route_condition(builder, route, SAME, Want("ResolvedRefs", "False", "RefNotPermitted"))
    assert [r.direct_status for r in routes_of(builder)] == [500]


def test_httproute_reference_grant() -> None:
    """Granted: resolved, to web-backend; the grant deleted: 500."""
    documents = raw("httproute-reference-grant")
    builder = build_raw(documents)
    route = http("reference-grant")
    assert_accepted(builder, SAME, [route])
    assert_route_condition(builder, route, SAME, RESOLVED)
    (served,) = routes_of(builder)
    assert [c.cluster for c in served.clusters] == [f"{WEB}/web-backend|8080"]
    grant = find(documents, "ReferenceGrant", "reference-grant")
    after = build_raw([d for d in documents if d is not grant])
    assert [r.direct_status for r in routes_of(after)] == [500]


def test_httproute_partially_invalid_via_invalid_reference_grant() -> None:
    builder = build("httproute-partially-invalid-via-invalid-reference-grant")
    route = http("invalid-reference-grant")
    assert_accepted(builder, SAME, [route])
    assert_route_condition(builder, route, SAME, Want("ResolvedRefs", "False", "RefNotPermitted"))
    by_path = {r.match.path_prefix or "/": r for r in routes_of(builder)}
    assert by_path["/v2"].direct_status == 500
    valid = by_path["/"]
    assert [c.cluster for c in valid.clusters] == [
        "gateway-conformance-app-backend/app-backend-v1|8080"
    ]


def test_httproute_disallowed_kind() -> None:
    builder = build("httproute-disallowed-kind")
    route = http("disallowed-kind")
    gateway = f"{INFRA}/tlsroutes-only"
    assert_route_condition(builder, route, gateway, RESOLVED)
    assert_route_condition(
        builder, route, gateway, Want("Accepted", "False", "NotAllowedByListeners")
    )
    assert_no_accepted_parents(builder, *route)
    zero_routes(builder, "tlsroutes-only")


def test_httproute_listener_hostname_matching() -> None:
    builder = build("httproute-listener-hostname-matching")
    gateway = f"{INFRA}/httproute-listener-hostname-matching"
    assert_accepted(
        builder,
        gateway,
        [http("backend-v1"), http("backend-v2"), http("backend-v3")],
    )
    for name in ("backend-v1", "backend-v2", "backend-v3"):
        assert_route_condition(builder, http(name), gateway, RESOLVED)


def test_grpcroute_listener_hostname_matching() -> None:
    builder = build("grpcroute-listener-hostname-matching")
    gateway = f"{INFRA}/grpcroute-listener-hostname-matching"
    assert_accepted(
        builder,
        gateway,
        [("GRPCRoute", INFRA, n) for n in ("backend-v1", "backend-v2", "backend-v3")],
    )


def test_httproute_listener_port_matching() -> None:
    builder = build("httproute-listener-port-matching")
    gateway = f"{INFRA}/httproute-listener-port-matching"
    names = ("backend-v1", "backend-v2", "backend-v3")
    assert_accepted(builder, gateway, [http(n) for n in names])
    for name in names:
        assert_route_condition(builder, http(name), gateway, RESOLVED)


def test_httproute_hostname_intersection() -> None:
    builder = build("httproute-hostname-intersection")
    name = "httproute-hostname-intersection"
    gateway = f"{INFRA}/{name}"
    intersecting = [
        "specific-host-matches-listener-specific-host",
        "specific-host-matches-listener-wildcard-host",
        "wildcard-host-matches-listener-specific-host",
        "wildcard-host-matches-listener-wildcard-host",
    ]
    assert_accepted(builder, gateway, [http(n) for n in intersecting])
    for route in intersecting:
        assert_route_condition(builder, http(route), gateway, RESOLVED)
    # "HTTPRoutes that do not intersect with listener hostnames"
    (parent,) = route_status(builder, "HTTPRoute", "no-intersecting-hosts").parents
    assert (parent.namespace, parent.name) == (INFRA, name)
    assert [(c.type, c.status, c.reason) for c in parent.conditions if c.type == "Accepted"] == [
        ("Accepted", "False", "NoMatchingListenerHostname")
    ]
    # "HTTPRoutes have to be counted in AttachedRoutes only if they are Accepted"
    ok = (Want("Accepted", "True"), Want("ResolvedRefs", "True"))
    assert_listeners(
        gateway_status(builder, name),
        [
            WantListener("listener-1", (HTTP_ROUTE,), ok, 2),
            WantListener("listener-2", (HTTP_ROUTE,), ok, 1),
            WantListener("listener-3", (HTTP_ROUTE,), ok, 1),
        ],
    )
    # "HTTPRoutes intersects with an unspecified hostname listener"
    everything = f"{INFRA}/httproute-hostname-intersection-all"
    assert_accepted(builder, everything, [http("httproute-hostname-intersection-all")])
    assert_route_condition(
        builder, http("httproute-hostname-intersection-all"), everything, RESOLVED
    )


def test_httproute_multiple_gateways() -> None:
    builder = build("httproute-multiple-gateways")
    assert_accepted(
        builder,
        SAME,
        [http("multiple-gateways-shared-route"), http("same-namespace-dedicated-route")],
    )
    assert_accepted(
        builder,
        f"{INFRA}/all-namespaces",
        [http("multiple-gateways-shared-route"), http("all-namespaces-dedicated-route")],
    )


def test_httproute_observed_generation_bump() -> None:
    """The route's parents as the catalog writes them (:mod:`trellis_catalog.routestatus`)
    observe the generation they were computed from: after the backend moves to
    infra-backend-v2 (generation 1 -> 2), Accepted and ResolvedRefs are True for
    same-namespace and every condition observes generation 2."""
    documents = raw("httproute-observed-generation-bump")
    route = find(documents, "HTTPRoute", "observed-generation-bump")
    route["metadata"]["generation"] = 1
    status = route_status(build_raw(documents), "HTTPRoute", "observed-generation-bump")
    first = routestatus.parents(status, route)
    assert first is not None
    assert _generations(first) == {1}
    route["status"] = {"parents": first}
    route["metadata"]["generation"] = 2
    route["spec"]["rules"][0]["backendRefs"][0]["name"] = "infra-backend-v2"
    builder = build_raw(documents)
    wanted = Want("Accepted", "True")
    assert_route_condition(builder, http("observed-generation-bump"), SAME, wanted)
    assert_route_condition(builder, http("observed-generation-bump"), SAME, RESOLVED)
    status = route_status(builder, "HTTPRoute", "observed-generation-bump")
    second = routestatus.parents(status, route)
    assert second is not None
    assert _generations(second) == {2}


def _generations(parents: list[dict[str, object]]) -> set[object]:
    return {
        c["observedGeneration"]
        for p in parents
        for c in p["conditions"]  # type: ignore[attr-defined]
    }
