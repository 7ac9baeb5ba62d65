"""Gateways of Trellis' GatewayClass: listeners, attachment, host names, ReferenceGrant and
status, as the catalog resolves them into the gateway identity's view."""

from __future__ import annotations

from collections.abc import Callable

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.model.views import GatewayPort, HttpMatch, Identity, Route
from trellis_spec.statuses import Status

Mesh = Callable[..., PolicyBuilder]
GATEWAY = Identity("shop", "my-gateway")

CLASS = """
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: trellis}
spec: {controllerName: trellis.dev/gateway}
"""
SERVICES = """
---
apiVersion: v1
kind: Service
metadata: {name: foo-v1, namespace: shop}
spec: {ports: [{name: grpc, port: 50051, appProtocol: grpc}]}
---
apiVersion: v1
kind: Service
metadata: {name: foo-v2, namespace: shop}
spec: {ports: [{name: grpc, port: 50051, appProtocol: grpc}]}
---
apiVersion: v1
kind: Service
metadata: {name: mirror-svc, namespace: shop}
spec: {ports: [{name: grpc, port: 50051, appProtocol: grpc}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: books, namespace: store}
spec: {ports: [{name: http, port: 8080}]}
"""
# GEP-1016's own example (its v1 spelling): a GRPCRoute on a Gateway.
GEP_ROUTE = """
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: foo-grpcroute, namespace: shop, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  parentRefs: [{name: my-gateway}]
  hostnames: [foo.com, bar.com]
  rules:
  - matches:
    - method: {service: helloworld.Greeter, method: SayHello}
      headers: [{type: Exact, name: magic, value: foo}]
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {add: [{name: my-header, value: foo}]}
    - type: RequestMirror
      requestMirror: {backendRef: {name: mirror-svc, port: 50051}}
    backendRefs:
    - {name: foo-v1, port: 50051, weight: 90}
    - {name: foo-v2, port: 50051, weight: 10}
"""


def gateway(listeners: str, name: str = "my-gateway", cls: str = "trellis") -> str:
    return f"""
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: {name}, namespace: shop}}
spec:
  gatewayClassName: {cls}
  listeners: {listeners}
"""


def http_route(
    name: str,
    parents: str = "[{name: my-gateway}]",
    hostnames: str = "[]",
    rules: str = "[{backendRefs: [{name: web, port: 80}]}]",
    namespace: str = "shop",
    created: str = "2026-01-02T00:00:00Z",
) -> str:
    return f"""
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {namespace}, creationTimestamp: "{created}"}}
spec:
  parentRefs: {parents}
  hostnames: {hostnames}
  rules: {rules}
"""


HTTP = "[{name: http, port: 8080, protocol: HTTP}]"


def ports(builder: PolicyBuilder, identity: Identity = GATEWAY) -> tuple[GatewayPort, ...]:
    return builder.build(identity, identity.service).gateway


def hosts(port: GatewayPort, server: int = 0) -> dict[str, list[str]]:
    """domain -> the names of its routes (the catch-all left out)."""
    return {
        domain: [r.source for r in vhost.routes if r.name != "no-route"]
        for vhost in port.servers[server].virtual_hosts
        for domain in vhost.domains
    }


def route_parent(builder: PolicyBuilder, key: str) -> dict[str, tuple[str, str]]:
    found = {**builder.routes.statuses, **(builder.gateways.statuses if builder.gateways else {})}
    status = found[key]  # TLSRoutes (Gateways only) are resolved with the Gateways
    parents = [p for p in status.parents if p.kind == "Gateway"]
    assert len(parents) == 1, status
    return {c.type: (c.status, c.reason) for c in parents[0].conditions}


def gateway_status(builder: PolicyBuilder, name: str = "my-gateway") -> Status:
    assert builder.gateways is not None
    from trellis_catalog.domain.routing.gateways import statuses

    return statuses(builder.gateways, builder.spec.gateways)[f"Gateway shop/{name}"]


def listener(status: Status, name: str) -> dict[str, tuple[str, str]]:
    found = next(item for item in status.listeners if item.name == name)
    return {c.type: (c.status, c.reason) for c in found.conditions}


def test_the_gep_example_is_served_by_the_gateway_identity(mesh: Mesh) -> None:
    builder = mesh(CLASS + SERVICES + gateway(HTTP) + GEP_ROUTE)
    (port,) = ports(builder)
    assert (port.port, port.protocol) == (8080, "HTTP")
    (server,) = port.servers
    assert server.listener == "shop/my-gateway/http"
    domains = {d: v.routes for v in server.virtual_hosts for d in v.domains}
    assert set(domains) == {"foo.com", "bar.com", "*"}
    route: Route = domains["foo.com"][0]
    assert route.match.path_exact == "/helloworld.Greeter/SayHello"
    assert [(m.name, m.value) for m in route.match.header_matches] == [("magic", "foo")]
    assert [(c.cluster, c.weight) for c in route.clusters] == [
        ("shop/foo-v1|50051", 90),
        ("shop/foo-v2|50051", 10),
    ]
    assert route.request_headers is not None
    assert route.request_headers.add == (("my-header", "foo"),)
    assert [m.cluster for m in route.mirrors] == ["shop/mirror-svc|50051"]
    # what no rule matches is answered 404 (a gRPC client: UNIMPLEMENTED)
    assert domains["foo.com"][-1].direct_status == 404
    assert [r.name for r in domains["*"]] == ["no-route"]
    policy = builder.build(GATEWAY, "my-gateway")
    assert {c.name for c in policy.clusters} == {
        "shop/foo-v1|50051",
        "shop/foo-v2|50051",
        "shop/mirror-svc|50051",
    }
    assert policy.outbound == ()
    assert policy.inbound == ()
    assert route_parent(builder, "GRPCRoute shop/foo-grpcroute") == {
        "Accepted": ("True", "Accepted"),
        "ResolvedRefs": ("True", "ResolvedRefs"),
    }
    status = gateway_status(builder)
    assert {c.type: c.status for c in status.conditions} == {
        "Accepted": "True",
        "Programmed": "True",
    }
    assert status.listeners[0].attached_routes == 1
    assert status.listeners[0].supported_kinds == (
        ("gateway.networking.k8s.io", "HTTPRoute"),
        ("gateway.networking.k8s.io", "GRPCRoute"),
    )


def test_another_controllers_class_and_its_gateways_are_left_alone(mesh: Mesh) -> None:
    other = CLASS.replace("trellis.dev/gateway", "example.com/gateway")
    builder = mesh(other + SERVICES + gateway(HTTP) + GEP_ROUTE)
    assert ports(builder) == ()
    status = gateway_status(builder)
    assert status.state == "ignored"
    assert status.conditions == ()
    assert builder.routes.statuses["GRPCRoute shop/foo-grpcroute"].state == "ignored"


def test_listener_isolation_and_hostname_fall_through(mesh: Mesh) -> None:
    listeners = (
        "[{name: any, port: 8080, protocol: HTTP},"
        " {name: wild, port: 8080, protocol: HTTP, hostname: '*.example.com'},"
        " {name: exact, port: 8080, protocol: HTTP, hostname: foo.example.com}]"
    )
    text = (
        CLASS
        + SERVICES
        + gateway(listeners)
        + http_route("all")  # every listener
        + http_route("named", hostnames="[foo.example.com, bar.example.com, other.org]")
        + http_route(
            "wild", hostnames="['*.example.com']", parents="[{name: my-gateway, sectionName: any}]"
        )
    )
    builder = mesh(text)
    (port,) = ports(builder)
    by_listener = {s.listener.rsplit("/", 1)[1]: i for i, s in enumerate(port.servers)}
    # the listener without a hostname keeps only names no more specific listener owns
    assert hosts(port, by_listener["any"]) == {
        "other.org": ["HTTPRoute shop/named rule 0", "HTTPRoute shop/all rule 0"],
        "*": ["HTTPRoute shop/all rule 0"],
    }
    assert hosts(port, by_listener["wild"]) == {
        "bar.example.com": ["HTTPRoute shop/named rule 0", "HTTPRoute shop/all rule 0"],
        "*.example.com": ["HTTPRoute shop/all rule 0"],
    }
    # on a listener with a hostname, a route without one holds for exactly that name: a tie,
    # broken by age, then namespace/name
    assert hosts(port, by_listener["exact"]) == {
        "foo.example.com": ["HTTPRoute shop/all rule 0", "HTTPRoute shop/named rule 0"],
    }
    status = gateway_status(builder)
    assert {item.name: item.attached_routes for item in status.listeners} == {
        "any": 3,
        "wild": 2,
        "exact": 2,
    }


def test_a_route_whose_hostnames_miss_the_listener_is_not_accepted(mesh: Mesh) -> None:
    listeners = "[{name: http, port: 8080, protocol: HTTP, hostname: foo.example.com}]"
    builder = mesh(CLASS + SERVICES + gateway(listeners) + http_route("r", hostnames="[bar.org]"))
    assert route_parent(builder, "HTTPRoute shop/r")["Accepted"] == (
        "False",
        "NoMatchingListenerHostname",
    )
    assert hosts(ports(builder)[0]) == {"foo.example.com": []}


def test_a_missing_section_or_port_is_no_matching_parent(mesh: Mesh) -> None:
    text = CLASS + SERVICES + gateway(HTTP)
    builder = mesh(text + http_route("r", parents="[{name: my-gateway, sectionName: nope}]"))
    assert route_parent(builder, "HTTPRoute shop/r")["Accepted"] == ("False", "NoMatchingParent")
    builder = mesh(text + http_route("r", parents="[{name: my-gateway, port: 9999}]"))
    assert route_parent(builder, "HTTPRoute shop/r")["Accepted"] == ("False", "NoMatchingParent")


def test_allowed_routes_namespaces(mesh: Mesh) -> None:
    route = http_route(
        "r",
        namespace="store",
        parents="[{name: my-gateway, namespace: shop}]",
        rules="[{backendRefs: [{name: books, port: 8080}]}]",
    )
    same = mesh(CLASS + SERVICES + gateway(HTTP) + route)
    assert route_parent(same, "HTTPRoute store/r")["Accepted"] == (
        "False",
        "NotAllowedByListeners",
    )
    every = HTTP.replace(
        "protocol: HTTP", "protocol: HTTP, allowedRoutes: {namespaces: {from: All}}"
    )
    assert route_parent(mesh(CLASS + SERVICES + gateway(every) + route), "HTTPRoute store/r")[
        "Accepted"
    ] == ("True", "Accepted")
    selector = HTTP.replace(
        "protocol: HTTP",
        "protocol: HTTP, allowedRoutes: {namespaces: {from: Selector, selector: "
        "{matchLabels: {shared-gateway: 'true'}}}}",
    )
    namespace = """
---
apiVersion: v1
kind: Namespace
metadata: {name: store, labels: {shared-gateway: 'true'}}
"""
    unlabelled = mesh(CLASS + SERVICES + gateway(selector) + route)
    assert route_parent(unlabelled, "HTTPRoute store/r")["Accepted"][0] == "False"
    labelled = mesh(CLASS + SERVICES + gateway(selector) + route + namespace)
    assert route_parent(labelled, "HTTPRoute store/r")["Accepted"] == ("True", "Accepted")
    (port,) = ports(labelled)
    assert hosts(port) == {"*": ["HTTPRoute store/r rule 0"]}


def test_allowed_route_kinds(mesh: Mesh) -> None:
    grpc_only = (
        "[{name: http, port: 8080, protocol: HTTP, allowedRoutes: {kinds: "
        "[{kind: GRPCRoute}, {kind: TCPRoute}]}}]"
    )
    builder = mesh(CLASS + SERVICES + gateway(grpc_only) + http_route("r"))
    assert route_parent(builder, "HTTPRoute shop/r")["Accepted"] == (
        "False",
        "NotAllowedByListeners",
    )
    status = gateway_status(builder)
    assert listener(status, "http")["ResolvedRefs"] == ("False", "InvalidRouteKinds")
    assert status.listeners[0].supported_kinds == (("gateway.networking.k8s.io", "GRPCRoute"),)


def test_unsupported_and_conflicting_listeners(mesh: Mesh) -> None:
    listeners = (
        "[{name: http, port: 8080, protocol: HTTP},"
        " {name: tcp, port: 9000, protocol: TCP},"
        " {name: clash, port: 8080, protocol: HTTPS, hostname: a.example.com,"
        "  tls: {certificateRefs: [{name: cert}]}}]"
    )
    builder = mesh(CLASS + SERVICES + gateway(listeners) + http_route("r"))
    status = gateway_status(builder)
    assert listener(status, "tcp")["Accepted"] == ("False", "UnsupportedProtocol")
    assert listener(status, "clash")["Conflicted"] == ("True", "ProtocolConflict")
    assert listener(status, "http")["Programmed"] == ("True", "Programmed")
    accepted = next(c for c in status.conditions if c.type == "Accepted")
    assert (accepted.status, accepted.reason) == ("True", "ListenersNotValid")
    assert status.state == "warning"
    assert [p.port for p in ports(builder)] == [8080]
    assert [p.protocol for p in ports(builder)] == ["HTTP"]


def test_https_certificates_across_namespaces_need_a_reference_grant(mesh: Mesh) -> None:
    listeners = (
        "[{name: https, port: 8443, protocol: HTTPS, hostname: shop.example.com,"
        " tls: {certificateRefs: [{name: shop-cert, namespace: certs}]}}]"
    )
    text = CLASS + SERVICES + gateway(listeners) + http_route("r")
    builder = mesh(text)
    assert listener(gateway_status(builder), "https")["ResolvedRefs"] == (
        "False",
        "RefNotPermitted",
    )
    assert ports(builder) == ()  # no certificate: not served
    grant = """
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways, namespace: certs}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: shop}]
  to: [{group: '', kind: Secret}]
"""
    granted = mesh(text + grant)
    (port,) = ports(granted)
    assert port.protocol == "HTTPS"
    (server,) = port.servers
    assert (server.hostname, server.tls_mode, server.certificates) == (
        "shop.example.com",
        "Terminate",
        (("certs", "shop-cert"),),
    )
    assert listener(gateway_status(granted), "https")["ResolvedRefs"] == ("True", "ResolvedRefs")


def test_backends_across_namespaces_need_a_reference_grant(mesh: Mesh) -> None:
    route = http_route("r", rules="[{backendRefs: [{name: books, namespace: store, port: 8080}]}]")
    builder = mesh(CLASS + SERVICES + gateway(HTTP) + route)
    assert route_parent(builder, "HTTPRoute shop/r")["ResolvedRefs"] == (
        "False",
        "RefNotPermitted",
    )
    (vhost,) = ports(builder)[0].servers[0].virtual_hosts
    assert vhost.routes[0].direct_status == 500  # the only backend is not permitted
    grant = """
---
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: routes, namespace: store}
spec:
  from: [{group: gateway.networking.k8s.io, kind: HTTPRoute, namespace: shop}]
  to: [{group: '', kind: Service, name: books}]
"""
    granted = mesh(CLASS + SERVICES + gateway(HTTP) + route + grant)
    assert route_parent(granted, "HTTPRoute shop/r")["ResolvedRefs"] == ("True", "ResolvedRefs")
    (vhost,) = ports(granted)[0].servers[0].virtual_hosts
    assert [c.cluster for c in vhost.routes[0].clusters] == ["store/books|8080"]


def test_a_grpc_and_an_http_route_cannot_share_a_hostname_on_a_listener(mesh: Mesh) -> None:
    text = CLASS + SERVICES + gateway(HTTP) + GEP_ROUTE + http_route("late", hostnames="[foo.com]")
    builder = mesh(text)
    assert route_parent(builder, "HTTPRoute shop/late")["Accepted"] == (
        "False",
        "NotAllowedByListeners",
    )
    assert route_parent(mesh(text.replace("[foo.com]", "[other.com]")), "HTTPRoute shop/late")[
        "Accepted"
    ] == ("True", "Accepted")


def test_precedence_within_a_host(mesh: Mesh) -> None:
    rules = (
        "[{matches: [{path: {type: PathPrefix, value: /}}], backendRefs: [{name: web, port: 80}]},"
        " {matches: [{path: {type: Exact, value: /books}}], backendRefs: [{name: web, port: 80}]}]"
    )
    builder = mesh(CLASS + SERVICES + gateway(HTTP) + http_route("r", rules=rules))
    (vhost,) = ports(builder)[0].servers[0].virtual_hosts
    # an exact path before a prefix, whatever the rules' order (PathPrefix / matches all)
    assert [r.match for r in vhost.routes[:2]] == [HttpMatch(path_exact="/books"), HttpMatch()]


def test_gateway_class_status(mesh: Mesh) -> None:
    builder = mesh(CLASS + SERVICES + gateway(HTTP))
    assert builder.gateways is not None
    status = builder.gateways.statuses["GatewayClass default/trellis"]
    assert {c.type: (c.status, c.reason) for c in status.conditions} == {
        "Accepted": ("True", "Accepted"),
        "SupportedVersion": ("True", "SupportedVersion"),
    }


def test_a_backend_that_is_a_split_root_is_split(mesh: Mesh) -> None:
    split = """
---
apiVersion: v1
kind: Service
metadata: {name: web-v1, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-v2, namespace: shop}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {name: web, namespace: shop}
spec:
  service: web
  backends: [{service: web-v1, weight: 75}, {service: web-v2, weight: 25}]
"""
    builder = mesh(CLASS + SERVICES + split + gateway(HTTP) + http_route("r"))
    (vhost,) = ports(builder)[0].servers[0].virtual_hosts
    assert [(c.cluster, c.weight) for c in vhost.routes[0].clusters] == [
        ("shop/web-v1|80", 7500),
        ("shop/web-v2|80", 2500),
    ]


TLS = (
    "[{name: tls, port: 8443, protocol: TLS, hostname: '*.example.com', tls: {mode: Passthrough}}]"
)
VAULT = """
---
apiVersion: v1
kind: Service
metadata: {name: vault, namespace: shop}
spec: {ports: [{name: https, port: 8200}]}
---
apiVersion: v1
kind: Service
metadata: {name: vault-old, namespace: shop}
spec: {ports: [{name: https, port: 8200}]}
"""


def tls_route(
    name: str, hostnames: str, backend: str = "vault", created: str = "2026-01-02T00:00:00Z"
) -> str:
    return f"""
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {{name: {name}, namespace: shop, creationTimestamp: "{created}"}}
spec:
  parentRefs: [{{name: my-gateway}}]
  hostnames: {hostnames}
  rules: [{{backendRefs: [{{name: {backend}, port: 8200}}]}}]
"""


def test_tls_routes_pass_tls_through_by_server_name(mesh: Mesh) -> None:
    text = (
        CLASS
        + SERVICES
        + VAULT
        + gateway(TLS)
        + tls_route("vault", "[vault.example.com, '*.example.com', other.org]")
        + tls_route(
            "late", "[vault.example.com, old.example.com]", "vault-old", "2026-02-01T00:00:00Z"
        )
    )
    builder = mesh(text)
    (port,) = ports(builder)
    assert (port.port, port.protocol) == (8443, "TLS")
    (server,) = port.servers
    assert server.tls_mode == "Passthrough"
    # each name is the older route's; other.org is outside the listener's *.example.com
    assert [
        (t.source, t.hostnames, [c.cluster for c in t.clusters]) for t in server.tls_routes
    ] == [
        ("TLSRoute shop/vault", ("vault.example.com", "*.example.com"), ["shop/vault|8200"]),
        ("TLSRoute shop/late", ("old.example.com",), ["shop/vault-old|8200"]),
    ]
    # a TLSRoute's backend port that declares no protocol is TCP (the TLS passes through)
    policy = builder.build(GATEWAY, "my-gateway")
    assert {c.name: c.protocol for c in policy.clusters} == {
        "shop/vault|8200": "tcp",
        "shop/vault-old|8200": "tcp",
    }
    assert route_parent(builder, "TLSRoute shop/vault") == {
        "Accepted": ("True", "Accepted"),
        "ResolvedRefs": ("True", "ResolvedRefs"),
    }
    status = gateway_status(builder)
    assert status.listeners[0].supported_kinds == (("gateway.networking.k8s.io", "TLSRoute"),)
    assert status.listeners[0].attached_routes == 2


def test_a_tls_listener_takes_only_tls_routes_and_only_passthrough(mesh: Mesh) -> None:
    builder = mesh(CLASS + SERVICES + VAULT + gateway(TLS) + http_route("web"))
    assert route_parent(builder, "HTTPRoute shop/web")["Accepted"] == (
        "False",
        "NotAllowedByListeners",
    )
    on_http = mesh(CLASS + SERVICES + VAULT + gateway(HTTP) + tls_route("t", "[a.example.com]"))
    assert route_parent(on_http, "TLSRoute shop/t")["Accepted"] == (
        "False",
        "NotAllowedByListeners",
    )
    terminate = TLS.replace("mode: Passthrough", "mode: Terminate, certificateRefs: [{name: c}]")
    status = gateway_status(mesh(CLASS + SERVICES + gateway(terminate)))
    assert listener(status, "tls")["Accepted"] == ("False", "UnsupportedValue")
