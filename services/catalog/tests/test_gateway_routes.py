"""Gateway API routes on Services (GAMMA): matches, precedence, conflicts, filters, weights,
access and status, as the catalog resolves them into a client's view."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.access.explain import explain
from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.index.services import ProvidedService
from trellis_catalog.domain.model.views import (
    HttpMatch,
    Identity,
    OutboundService,
    Route,
    ValueMatch,
)
from trellis_catalog.domain.publish import destinations
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec.statuses import Status

Mesh = Callable[..., PolicyBuilder]

SERVICES = """
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: shop}
spec: {ports: [{port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: hello-v1, namespace: shop}
spec: {ports: [{port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: hello-v2, namespace: shop}
spec: {ports: [{port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}, {name: tcp-db, port: 5432}]}
---
apiVersion: v1
kind: Service
metadata: {name: client, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
"""
PERMISSIVE = """
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}}
"""
CLIENT = Identity("shop", "client")


def grpc_route(
    name: str = "hello",
    rules: str = "[{backendRefs: [{name: hello-v1, port: 9000}]}]",
    parent: str = "{group: '', kind: Service, name: hello, port: 9000}",
    hostnames: str = "[]",
    namespace: str = "shop",
    created: str = "2026-01-01T00:00:00Z",
    kind: str = "GRPCRoute",
) -> str:
    return f"""
---
apiVersion: gateway.networking.k8s.io/v1
kind: {kind}
metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: "{created}"}}
spec:
  parentRefs: [{parent}]
  hostnames: {hostnames}
  rules: {rules}
"""


def http_route(**fields: Any) -> str:
    fields.setdefault("parent", "{group: '', kind: Service, name: web, port: 80}")
    fields.setdefault("rules", "[{backendRefs: [{name: web, port: 80}]}]")
    fields.setdefault("name", "web")
    return grpc_route(kind="HTTPRoute", **fields)


def outbound(
    builder: PolicyBuilder, name: str, port: int, client: Identity = CLIENT
) -> OutboundService:
    policy = builder.build(client, client.service)
    found = [o for o in policy.outbound if o.name == name and o.port == port]
    assert found, (
        f"{name}:{port} is not a destination of {client}: {[o.name for o in policy.outbound]}"
    )
    return found[0]


def status(builder: PolicyBuilder, key: str) -> Status:
    return builder.routes.statuses[key]


def conditions(found: Status, parent: int = 0) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in found.parents[parent].conditions}


# -- method matches: GEP-1016's matrix ---------------------------------------------------


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (
            "{service: helloworld.Greeter, method: SayHello}",
            HttpMatch(path_exact="/helloworld.Greeter/SayHello"),
        ),
        ("{service: helloworld.Greeter}", HttpMatch(path_prefix="/helloworld.Greeter")),
        ("{method: SayHello}", HttpMatch(path_regex="/[^/]+/SayHello")),
        (
            "{type: RegularExpression, service: 'helloworld\\..*', method: 'Say.*'}",
            HttpMatch(path_regex="/(?:helloworld\\..*)/(?:Say.*)"),
        ),
        ("{type: RegularExpression, service: 'a|b'}", HttpMatch(path_regex="/(?:a|b)/(?:[^/]+)")),
        (
            "{type: RegularExpression, method: 'Get.*'}",
            HttpMatch(path_regex="/(?:[^/]+)/(?:Get.*)"),
        ),
    ],
)
def test_method_match_matrix(mesh: Mesh, method: str, expected: HttpMatch) -> None:
    rules = f"[{{matches: [{{method: {method}}}], backendRefs: [{{name: hello-v1, port: 9000}}]}}]"
    routes = outbound(mesh(SERVICES + PERMISSIVE + grpc_route(rules=rules)), "hello", 9000).routes
    assert routes[0].match == expected
    assert routes[-1].direct_status == 404  # no match: UNIMPLEMENTED
    assert routes[-1].name == "no-route"


def test_exact_method_match_with_neither_service_nor_method_is_refused(
    docs_and_errors: Callable[[str], tuple[list[Any], list[Any]]],
) -> None:
    rules = "[{matches: [{method: {type: Exact}}]}]"
    _, errors = docs_and_errors(grpc_route(rules=rules))
    assert len(errors) == 1
    assert errors[0].field == "spec.rules[0].matches[0].method"
    assert "one or both of 'service' or 'method'" in errors[0].reason


def test_an_empty_match_list_matches_everything_and_matches_are_ored(mesh: Mesh) -> None:
    rules = (
        "[{matches: [{method: {service: a.A}}, {headers: [{name: x-v, value: '2'}]}],"
        " backendRefs: [{name: hello-v2, port: 9000}]},"
        " {backendRefs: [{name: hello-v1, port: 9000}]}]"
    )
    routes = outbound(mesh(SERVICES + PERMISSIVE + grpc_route(rules=rules)), "hello", 9000).routes
    assert [r.match for r in routes[:3]] == [
        HttpMatch(path_prefix="/a.A"),
        HttpMatch(header_matches=(ValueMatch("x-v", "2"),)),
        HttpMatch(),
    ]
    assert [r.clusters[0].cluster for r in routes[:3]] == [
        "shop/hello-v2|9000",
        "shop/hello-v2|9000",
        "shop/hello-v1|9000",
    ]


def test_header_names_are_case_insensitive_and_the_first_equivalent_wins(mesh: Mesh) -> None:
    rules = (
        "[{matches: [{headers: [{name: X-Version, value: '2'}, {name: x-version, value: '3'},"
        " {type: RegularExpression, name: env, value: 'prod|stage'}]}],"
        " backendRefs: [{name: hello-v1, port: 9000}]}]"
    )
    routes = outbound(mesh(SERVICES + PERMISSIVE + grpc_route(rules=rules)), "hello", 9000).routes
    assert routes[0].match.header_matches == (
        ValueMatch("x-version", "2"),
        ValueMatch("env", "prod|stage", regex=True),
    )


# -- precedence ---------------------------------------------------------------------------


def _order(routes: tuple[Route, ...]) -> list[str]:
    return [r.name for r in routes]


def test_grpc_precedence_service_then_method_then_headers_then_age_then_name(mesh: Mesh) -> None:
    backend = "backendRefs: [{name: hello-v1, port: 9000}]"
    text = (
        SERVICES
        + PERMISSIVE
        + grpc_route(name="b-old", created="2025-01-01T00:00:00Z", rules=f"[{{{backend}}}]")
        + grpc_route(name="a-new", created="2026-06-01T00:00:00Z", rules=f"[{{{backend}}}]")
        + grpc_route(name="a-same", created="2025-01-01T00:00:00Z", rules=f"[{{{backend}}}]")
        + grpc_route(
            name="headers",
            rules="[{matches: [{headers: [{name: a, value: '1'}, {name: b, value: '1'}]},"
            f" {{headers: [{{name: a, value: '1'}}]}}], {backend}}}]",
        )
        + grpc_route(
            name="method",
            rules=f"[{{matches: [{{method: {{method: LongMethodName}}}}]}},"
            f" {{matches: [{{method: {{method: M}}}}], {backend}}}]",
        )
        + grpc_route(
            name="service", rules=f"[{{matches: [{{method: {{service: s.S}}}}], {backend}}}]"
        )
    )
    routes = outbound(mesh(text), "hello", 9000).routes
    assert _order(routes) == [
        "GRPCRoute shop/service rule 0 match 0",  # service characters first
        "GRPCRoute shop/method rule 0 match 0",  # then method characters: 14 > 1
        "GRPCRoute shop/method rule 1 match 0",
        "GRPCRoute shop/headers rule 0 match 0",  # two header matches
        "GRPCRoute shop/headers rule 0 match 1",
        "GRPCRoute shop/a-same rule 0 match 0",  # oldest, then by namespace/name
        "GRPCRoute shop/b-old rule 0 match 0",
        "GRPCRoute shop/a-new rule 0 match 0",
        "no-route",
    ]


def test_hostname_precedence_non_wildcard_first_then_longer(mesh: Mesh) -> None:
    backend = "[{backendRefs: [{name: hello-v1, port: 9000}]}]"
    text = (
        SERVICES
        + PERMISSIVE
        + grpc_route(
            name="any",
            rules="[{matches: [{method: {service: very.long.Service}}],"
            " backendRefs: [{name: hello-v1, port: 9000}]}]",
        )
        + grpc_route(name="wild", hostnames="['*.shop.svc.cluster.local']", rules=backend)
        + grpc_route(name="exact", hostnames="[hello.shop]", rules=backend)
    )
    routes = outbound(mesh(text), "hello", 9000).routes
    assert _order(routes)[:3] == [
        "GRPCRoute shop/exact rule 0 match 0",
        "GRPCRoute shop/wild rule 0 match 0",
        "GRPCRoute shop/any rule 0 match 0",
    ]
    assert routes[0].hostnames == ("hello.shop",)
    assert routes[1].hostnames == ("hello.shop.svc.cluster.local",)  # the wildcard, intersected
    assert routes[2].hostnames == ()


def test_http_precedence_exact_regex_longest_prefix_method_headers_query(mesh: Mesh) -> None:
    backend = "backendRefs: [{name: web, port: 80}]"
    rules = (
        "[{matches: [{path: {value: /}}, {path: {value: /api}}, {path: {value: /api/v1/}},"
        " {path: {type: Exact, value: /api}}, {path: {type: RegularExpression, value: '/x.*'}},"
        " {path: {value: /api}, method: GET}, {path: {value: /api}, method: GET,"
        " headers: [{name: a, value: b}]}, {path: {value: /api}, method: GET,"
        " headers: [{name: a, value: b}], queryParams: [{name: q, value: '1'}]}],"
        f" {backend}}}]"
    )
    routes = outbound(mesh(SERVICES + PERMISSIVE + http_route(rules=rules)), "web", 80).routes
    assert [r.name.rsplit(" ", 1)[1] for r in routes[:-1]] == [
        "3",
        "4",
        "2",
        "7",
        "6",
        "5",
        "1",
        "0",
    ]
    assert routes[2].match.path_prefix == "/api/v1"  # a trailing slash does not count
    assert routes[-2].match == HttpMatch()  # PathPrefix "/" is every path


# -- hostnames, conflicts, parents ------------------------------------------------------------


def test_hostnames_that_are_no_name_of_the_parent_are_not_accepted(mesh: Mesh) -> None:
    builder = mesh(SERVICES + PERMISSIVE + grpc_route(hostnames="[hello.example.com]"))
    found = status(builder, "GRPCRoute shop/hello")
    assert found.state == "error"
    assert conditions(found)["Accepted"] == ("False", "NoMatchingListenerHostname")
    routes = outbound(builder, "hello", 9000).routes
    assert [r.name for r in routes] == ["default"]  # the Service's own routing stays


def test_a_grpc_route_and_an_http_route_on_one_hostname_reject_the_later(mesh: Mesh) -> None:
    text = (
        SERVICES
        + PERMISSIVE
        + grpc_route(name="old", created="2025-01-01T00:00:00Z", hostnames="[hello.shop]")
        + http_route(
            name="new",
            parent="{group: '', kind: Service, name: hello}",
            hostnames="['*.shop']",
            rules="[{backendRefs: [{name: hello-v2, port: 9000}]}]",
        )
        + http_route(
            name="other-host",
            parent="{group: '', kind: Service, name: hello}",
            hostnames="[hello.shop.svc]",
            rules="[{backendRefs: [{name: hello-v2, port: 9000}]}]",
        )
    )
    builder = mesh(text)
    assert conditions(status(builder, "GRPCRoute shop/old"))["Accepted"] == ("True", "Accepted")
    rejected = status(builder, "HTTPRoute shop/new")
    assert conditions(rejected)["Accepted"] == ("False", "NotAllowedByListeners")
    assert "GRPCRoute shop/old" in rejected.reason
    assert conditions(status(builder, "HTTPRoute shop/other-host"))["Accepted"][0] == "True"
    names = {r.source for r in outbound(builder, "hello", 9000).routes}
    assert "HTTPRoute shop/new rule 0" not in names
    assert "HTTPRoute shop/other-host rule 0" in names


@pytest.mark.parametrize(
    ("parent", "reason"),
    [
        ("{group: '', kind: Service, name: nowhere}", "NoMatchingParent"),
        ("{group: '', kind: Service, name: hello, port: 1234}", "NoMatchingParent"),
        ("{group: '', kind: Service, name: hello, sectionName: grpc}", "NoMatchingParent"),
    ],
)
def test_a_parent_that_does_not_exist_is_not_accepted(mesh: Mesh, parent: str, reason: str) -> None:
    found = status(mesh(SERVICES + grpc_route(parent=parent)), "GRPCRoute shop/hello")
    assert found.state == "error"
    assert conditions(found)["Accepted"] == ("False", reason)


def test_a_route_with_only_gateway_parents_is_ignored(mesh: Mesh) -> None:
    found = status(mesh(SERVICES + grpc_route(parent="{name: my-gateway}")), "GRPCRoute shop/hello")
    assert found.state == "ignored"
    assert found.parents == ()


def test_a_consumer_route_holds_for_its_namespace_only(
    mesh: Mesh, report: Callable[..., ProvidedService]
) -> None:
    text = (
        SERVICES
        + PERMISSIVE
        + """
---
apiVersion: v1
kind: Service
metadata: {name: client, namespace: other}
spec: {ports: [{name: http, port: 80}]}
"""
        + grpc_route(
            name="consumer",
            namespace="other",
            parent="{group: '', kind: Service, name: hello, namespace: shop}",
            rules="[{backendRefs: [{name: client, port: 80}]}]",
        )
        + grpc_route(name="producer")
    )
    builder = mesh(text)
    mine = outbound(builder, "hello", 9000, Identity("other", "client")).routes
    theirs = outbound(builder, "hello", 9000).routes
    assert [r.source for r in mine[:-1]] == ["GRPCRoute other/consumer rule 0"]
    assert [r.source for r in theirs[:-1]] == ["GRPCRoute shop/producer rule 0"]


# -- backends, weights, filters -----------------------------------------------------------


def test_invalid_backends_keep_their_share_and_weight_zero_gets_nothing(mesh: Mesh) -> None:
    rules = (
        "[{backendRefs: [{name: hello-v1, port: 9000, weight: 80}, {name: missing, port: 9000,"
        " weight: 20}, {name: hello-v2, port: 9000, weight: 0}, {kind: Pod, name: p, port: 1},"
        " {name: hello-v2, port: 9999}, {name: hello-v2, namespace: elsewhere, port: 9000}]}]"
    )
    builder = mesh(SERVICES + PERMISSIVE + grpc_route(rules=rules))
    route = outbound(builder, "hello", 9000).routes[0]
    assert [(c.cluster, c.weight) for c in route.clusters] == [
        ("shop/hello-v1|9000", 80),
        ("", 20),
        ("", 1),
        ("", 1),
        ("", 1),
    ]
    assert route.invalid_status == 503  # gRPC UNAVAILABLE
    found = status(builder, "GRPCRoute shop/hello")
    assert found.state == "warning"
    assert conditions(found)["ResolvedRefs"] == ("False", "BackendNotFound")
    for text in (
        "Service shop/missing not found",
        "Pod (core) is not a Service",
        "has no port 9999",
        "ReferenceGrant",
    ):
        assert text in found.reason


def test_a_rule_with_no_backend_answers_the_error(mesh: Mesh) -> None:
    builder = mesh(
        SERVICES
        + PERMISSIVE
        + grpc_route(rules="[{matches: [{method: {service: a.A}}]}]")
        + http_route(rules="[{}]")
    )
    assert outbound(builder, "hello", 9000).routes[0].direct_status == 503
    assert outbound(builder, "web", 80).routes[0].direct_status == 500


def test_filters_header_modifiers_mirror_and_extension_ref(mesh: Mesh) -> None:
    rules = (
        "[{filters: [{type: RequestHeaderModifier,"
        " requestHeaderModifier: {set: [{name: x-a, value: '1'}],"
        " add: [{name: x-b, value: '2'}], remove: [x-c]}}, {type: ResponseHeaderModifier,"
        " responseHeaderModifier: {set: [{name: x-r, value: '3'}]}}, {type: RequestMirror,"
        " requestMirror: {backendRef: {name: hello-v2, port: 9000}, percent: 25}}],"
        " backendRefs: [{name: hello-v1, port: 9000, filters: [{type: RequestHeaderModifier,"
        " requestHeaderModifier: {set: [{name: x-backend, value: v1}]}}]}]},"
        " {matches: [{method: {service: ext.E}}], filters: [{type: ExtensionRef,"
        " extensionRef: {group: example.com, kind: Auth, name: a}}],"
        " backendRefs: [{name: hello-v1, port: 9000}]}]"
    )
    builder = mesh(SERVICES + PERMISSIVE + grpc_route(rules=rules))
    routes = {r.source: r for r in outbound(builder, "hello", 9000).routes}
    plain = routes["GRPCRoute shop/hello rule 0"]
    assert plain.request_headers is not None
    assert plain.request_headers.set == (("x-a", "1"),)
    assert plain.request_headers.add == (("x-b", "2"),)
    assert plain.request_headers.remove == ("x-c",)
    assert plain.response_headers is not None
    assert plain.response_headers.set == (("x-r", "3"),)
    assert [(m.cluster, m.numerator, m.denominator) for m in plain.mirrors] == [
        ("shop/hello-v2|9000", 25, 100)
    ]
    assert plain.clusters[0].request_headers is not None
    assert plain.clusters[0].request_headers.set == (("x-backend", "v1"),)
    ext = routes["GRPCRoute shop/hello rule 1"]
    assert ext.direct_status == 500
    assert ext.clusters == ()
    found = status(builder, "GRPCRoute shop/hello")
    assert conditions(found)["ResolvedRefs"] == ("False", "InvalidKind")
    assert "ExtensionRef Auth a" in found.reason


def test_http_route_timeouts_redirect_and_rewrite(mesh: Mesh) -> None:
    rules = (
        "[{matches: [{path: {value: /old}}], filters: [{type: RequestRedirect, requestRedirect:"
        " {scheme: https, statusCode: 301,"
        " path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]},"
        " {matches: [{path: {value: /api}}], filters: [{type: URLRewrite, urlRewrite:"
        " {hostname: api.internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}}],"
        " timeouts: {request: 1m30s, backendRequest: 500ms}, backendRefs: [{name: web, port: 80}]}]"
    )
    routes = {
        r.source: r
        for r in outbound(mesh(SERVICES + PERMISSIVE + http_route(rules=rules)), "web", 80).routes
    }
    redirect = routes["HTTPRoute shop/web rule 0"]
    assert redirect.redirect is not None
    assert redirect.direct_status == 0
    assert (redirect.redirect.scheme, redirect.redirect.status_code) == ("https", 301)
    assert (redirect.redirect.prefix_path, redirect.redirect.matched_prefix) == ("/new", "/old")
    rewrite = routes["HTTPRoute shop/web rule 1"]
    assert rewrite.rewrite is not None
    assert rewrite.rewrite.hostname == "api.internal"
    assert (rewrite.timeout, rewrite.backend_timeout) == (90.0, 0.5)


def test_grpc_backend_ports_without_a_declared_protocol_are_grpc(mesh: Mesh) -> None:
    builder = mesh(SERVICES + PERMISSIVE + grpc_route())
    clusters = {c.name: c.protocol for c in builder.build(CLIENT, "client").clusters}
    assert clusters["shop/hello-v1|9000"] == "grpc"
    assert clusters["shop/web|80"] == "http"  # named http: declared, and no GRPCRoute's


def test_http_routes_do_not_route_tcp_ports(mesh: Mesh) -> None:
    text = SERVICES + PERMISSIVE + http_route(parent="{group: '', kind: Service, name: web}")
    tcp = outbound(mesh(text), "web", 5432)
    assert [r.name for r in tcp.routes] == ["default"]


# -- access ----------------------------------------------------------------------------------


ACCESS = """
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: all, namespace: shop}
spec: {matches: [{name: all, pathRegex: '.*'}]}
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: client-to-v1, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: hello-v1, namespace: shop}
  sources: [{kind: ServiceAccount, name: client, namespace: shop}]
  rules: [{kind: HTTPRouteGroup, name: all}]
"""


def test_routes_send_only_where_traffic_targets_allow(mesh: Mesh) -> None:
    rules = (
        "[{backendRefs: [{name: hello-v1, port: 9000, weight: 50},"
        " {name: hello-v2, port: 9000, weight: 50}]}]"
    )
    builder = mesh(SERVICES + ACCESS + grpc_route(rules=rules))
    found = outbound(builder, "hello", 9000)
    assert [(c.cluster, c.weight) for c in found.routes[0].clusters] == [
        ("shop/hello-v1|9000", 50),
        ("", 50),
    ]
    assert found.spiffe_ids == ("spiffe://cluster.local/ns/shop/sa/hello-v1",)
    stranger = builder.build(Identity("shop", "web"), "web")
    assert all(o.name != "hello" for o in stranger.outbound)  # may call no backend, nor hello


GRPC_ACCESS = """
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: client-greets, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: hello-v1, namespace: shop}
  sources: [{kind: ServiceAccount, name: client, namespace: shop}]
  rules: [{kind: GRPCRoute, name: hello, matches: [greet]}]
"""


def test_a_traffic_target_allows_by_the_methods_of_a_grpc_route(mesh: Mesh) -> None:
    rules = (
        "[{name: greet, matches: [{method: {service: helloworld.Greeter, method: SayHello},"
        " headers: [{name: x-tenant, value: a}]}], backendRefs: [{name: hello-v1, port: 9000}]},"
        " {name: other, matches: [{method: {service: admin.Admin}}],"
        " backendRefs: [{name: hello-v1, port: 9000}]}]"
    )
    builder = mesh(SERVICES + grpc_route(rules=rules) + GRPC_ACCESS)
    assert builder.spec.statuses["TrafficTarget shop/client-greets"].state == "valid"
    [port] = builder.build(Identity("shop", "hello-v1"), "hello-v1").inbound
    [rule] = port.rules
    assert rule.source_spiffe_ids == ("spiffe://cluster.local/ns/shop/sa/client",)
    assert rule.http == (
        HttpMatch(
            path_exact="/helloworld.Greeter/SayHello",
            header_matches=(ValueMatch("x-tenant", "a"),),
        ),
    )
    assert outbound(builder, "hello", 9000).routes[0].clusters[0].cluster == "shop/hello-v1|9000"


def test_a_traffic_target_naming_a_missing_grpc_route_or_rule_says_which(mesh: Mesh) -> None:
    missing = GRPC_ACCESS.replace("name: hello, matches: [greet]", "name: nowhere")
    found = mesh(SERVICES + missing).spec.statuses["TrafficTarget shop/client-greets"]
    assert found.state == "error"
    assert "GRPCRoute shop/nowhere not found" in found.reason
    unnamed = mesh(SERVICES + grpc_route() + GRPC_ACCESS).spec.statuses[
        "TrafficTarget shop/client-greets"
    ]
    assert "has no rule named 'greet'" in unnamed.reason


def test_a_route_on_a_split_root_takes_over_and_the_split_says_so(
    mesh: Mesh, docs: Callable[[str], list[Any]]
) -> None:
    split = """
---
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: hello-split, namespace: shop}
spec: {service: hello, backends: [{service: hello-v1, weight: 1}, {service: hello-v2, weight: 1}]}
"""
    text = SERVICES + PERMISSIVE + split + grpc_route()
    routes = outbound(mesh(text), "hello", 9000).routes
    assert routes[0].source == "GRPCRoute shop/hello rule 0"
    assert [c.cluster for c in routes[0].clusters] == ["shop/hello-v1|9000"]
    catalog = Catalog()
    catalog.set_documents(docs(text), [])
    catalog.flush()
    status = catalog.spec.statuses["TrafficSplit shop/hello-split"]
    assert status.state == "warning"
    assert "GRPCRoute shop/hello attached to shop/hello: its rules take over" in status.reason


def test_policy_check_says_what_shapes_the_calls(mesh: Mesh) -> None:
    retry = """
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Retry
metadata: {name: client-retry, namespace: shop}
spec:
  source: {kind: ServiceAccount, name: client, namespace: shop}
  destinations: [{kind: Service, name: hello, namespace: shop}]
  retryPolicy: {retryOn: "5xx"}
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: hello-limits, namespace: shop}
spec:
  host: hello.shop.svc.cluster.local
  rateLimit: {local: {http: {requests: 10, unit: second}}}
"""
    flags = PERMISSIVE.replace(
        "{enablePermissiveTrafficPolicyMode: true}}",
        "{enablePermissiveTrafficPolicyMode: true}, featureFlags: {enableRetryPolicy: true}}",
    )
    builder = mesh(SERVICES + flags + grpc_route() + retry)
    decision = explain(builder, ServiceAccount("shop", "client"), MeshService("shop", "hello"))
    assert decision.allowed
    assert decision.shaped_by == (
        "GRPCRoute shop/hello (routes)",
        "Retry shop/client-retry (retryOn 5xx)",
        "UpstreamTrafficSetting shop/hello-limits (rateLimit.local)",
    )


# -- destinations: the profile a Linkerd client gets ---------------------------------------


def destination_of(builder: PolicyBuilder, name: str) -> destinations.Destination:
    service = MeshService("shop", name)
    rules = builder.routes.rules.get(service, [])
    return destinations.build(builder.services[service], builder.spec, name, "td", rules)


def test_a_destination_carries_its_routes_rules_timeouts_and_backends(mesh: Mesh) -> None:
    rules = (
        "[{matches: [{path: {type: PathPrefix, value: /books}}], timeouts: {request: 2500ms},"
        " backendRefs: [{name: hello-v1, port: 9000, weight: 3},"
        " {name: hello-v2, port: 9000, weight: 1}]},"
        " {matches: [{path: {type: Exact, value: /health}}],"
        " backendRefs: [{name: hello-v1, port: 9000, weight: 3},"
        " {name: hello-v2, port: 9000, weight: 1}]}]"
    )
    parent = "{group: '', kind: Service, name: hello, port: 9000}"
    builder = mesh(SERVICES + PERMISSIVE + http_route(name="hello", parent=parent, rules=rules))
    found = destination_of(builder, "hello")
    assert [(r.match.path_prefix, r.match.path_exact, r.timeout, r.port) for r in found.routes] == [
        ("", "/health", 0.0, 9000),
        ("/books", "", 2.5, 9000),
    ]
    assert found.routes[1].name == "HTTPRoute shop/hello rule 0"
    assert found.splits == (
        destinations.Override(MeshService("shop", "hello-v1"), 3, 9000),
        destinations.Override(MeshService("shop", "hello-v2"), 1, 9000),
    )
    assert found.split == ""


def test_rules_that_send_to_different_backends_override_nothing(mesh: Mesh) -> None:
    rules = (
        "[{matches: [{method: {service: a.A}}], backendRefs: [{name: hello-v1, port: 9000}]},"
        " {matches: [{method: {service: b.B}}], backendRefs: [{name: hello-v2, port: 9000}]}]"
    )
    found = destination_of(mesh(SERVICES + PERMISSIVE + grpc_route(rules=rules)), "hello")
    assert [r.match.path_prefix for r in found.routes] == ["/a.A", "/b.B"]
    assert found.splits == ()


def test_opaque_ports_come_from_the_services_annotation_else_linkerds_defaults(
    mesh: Mesh,
) -> None:
    annotated = """
---
apiVersion: v1
kind: Service
metadata:
  name: db
  namespace: shop
  annotations: {config.linkerd.io/opaque-ports: "8080, 9000-9002,tcp-db"}
spec: {ports: [{name: tcp-db, port: 7000}, {name: http, port: 8080}]}
"""
    builder = mesh(SERVICES + PERMISSIVE + annotated)
    assert destination_of(builder, "db").opaque_ports == (7000, 8080, 9000, 9001, 9002)
    assert destination_of(builder, "web").opaque_ports == destinations.DEFAULT_OPAQUE_PORTS
    assert destinations.DEFAULT_OPAQUE_PORTS == (25, 587, 3306, 4444, 5432, 6379, 9300, 11211)
