"""SMI semantics of one identity's policy (``PolicyBuilder``) and of ``explain``.

Each test writes the documents it needs in YAML; ``mesh`` (conftest) builds the spec and
the service index and returns the builder. A service's account is its name unless the
test maps it (``accounts={"shop/api-v1": "api"}``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trellis_catalog.domain.access.explain import explain
from trellis_catalog.domain.access.inbound import http_match
from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import (
    MATCH_ALL,
    ExternalService,
    HttpMatch,
    Identity,
    IdentityPolicy,
    InboundPort,
    InboundRule,
    OutboundService,
    Route,
    Tracing,
    WeightedCluster,
)
from trellis_common.documents import smi
from trellis_common.model import MeshService, ServiceAccount

Mesh = Callable[..., PolicyBuilder]
Endpoint = Callable[..., ProvidedEndpoint]
Report = Callable[..., ProvidedService]

WEB = Identity("shop", "web")
API = Identity("shop", "api")
WEB_ID = "spiffe://cluster.local/ns/shop/sa/web"
API_ID = "spiffe://cluster.local/ns/shop/sa/api"


def service(name: str, ports: str = "[{name: http, port: 80}]", namespace: str = "shop") -> str:
    return f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {namespace}}}
spec: {{ports: {ports}}}"""


def target(
    name: str,
    destination: str,
    sources: str,
    rules: str = "[{kind: HTTPRouteGroup, name: api-routes}]",
    *,
    version: str = "v1alpha3",
    port: int | None = None,
) -> str:
    at = f", port: {port}" if port else ""
    return f"""apiVersion: access.smi-spec.io/{version}
kind: TrafficTarget
metadata: {{name: {name}, namespace: shop}}
spec:
  destination: {{kind: ServiceAccount, name: {destination}{at}}}
  sources: {sources}
  rules: {rules}"""


def split(backends: str, matches: str = "", version: str = "v1alpha2", root: str = "api") -> str:
    return f"""apiVersion: split.smi-spec.io/{version}
kind: TrafficSplit
metadata: {{name: {root}-split, namespace: shop}}
spec:
  service: {root}
  backends: {backends}
  {f"matches: {matches}" if matches else ""}"""


def docs(*parts: str) -> str:
    return "\n---\n".join(parts)


ROUTES = """apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: api-routes, namespace: shop}
spec:
  matches:
  - {name: get-items, pathRegex: /items, methods: [GET], headers: {x-user: "^[a-z]+$"}}
  - {name: anything, methods: ["*"]}"""
GET_ITEMS = HttpMatch("/items", ("GET",), (("x-user", "^[a-z]+$"),))
PERMISSIVE = """apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}, featureFlags: {ignored: true}}"""
SHOP = docs(
    service("api", "[{name: http, port: 80, targetPort: 8080}]"),
    service("web"),
    service("db", "[{name: tcp-db, port: 5432}]"),
    ROUTES,
)
WEB_SOURCE = "[{kind: ServiceAccount, name: web}]"
WEB_TO_API = target("web-to-api", "api", WEB_SOURCE)


def hosts(name: str, port: int) -> tuple[str, ...]:
    names = (name, f"{name}.shop", f"{name}.shop.svc", f"{name}.shop.svc.cluster.local")
    return names + tuple(f"{n}:{port}" for n in names)


def default_route(cluster: str) -> tuple[Route, ...]:
    return (Route("default", MATCH_ALL, (WeightedCluster(cluster, 100),)),)


def names(policy: IdentityPolicy) -> list[str]:
    return [f"{o.namespace}/{o.name}:{o.port}" for o in policy.outbound]


# -- deny by default and TrafficTargets ---------------------------------------------------


def test_without_traffic_targets_nothing_is_allowed(mesh: Mesh) -> None:
    builder = mesh(SHOP)

    web = builder.build(WEB, "web")
    assert (web.outbound, web.external, web.clusters) == ((), (), ())
    assert web.spiffe_id == WEB_ID
    assert not web.mesh.permissive
    api = builder.build(API, "api")
    assert api.inbound == (InboundPort(80, 8080, "http", "http", rules=(), allow_any=False),)


def test_traffic_target_allows_every_service_of_the_destination_account(mesh: Mesh) -> None:
    builder = mesh(
        docs(SHOP, service("api-admin"), service("other"), WEB_TO_API),
        accounts={"shop/api-admin": "api"},
    )

    web = builder.build(WEB, "web")
    assert web.outbound == tuple(
        OutboundService(
            "shop", name, 80, "http", hosts(name, 80), default_route(f"shop/{name}|80"), (API_ID,)
        )
        for name in ("api", "api-admin")
    )
    assert web.cluster_names == ("shop/api-admin|80", "shop/api|80")
    assert builder.build(Identity("shop", "thief"), "thief").outbound == ()

    rule = InboundRule("shop/web-to-api", (WEB_ID,), (GET_ITEMS, MATCH_ALL))
    for identity in (API, Identity("shop", "api-admin")):  # both run as account shop/api
        [port] = builder.build(identity, "api").inbound
        assert port.rules == (rule,)
        assert not port.allow_any
    assert builder.build(Identity("shop", "other"), "other").inbound[0].rules == ()
    assert builder.build(WEB, "web").inbound[0].rules == ()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"name": "any", "methods": ["*"]}, MATCH_ALL),
        ({"name": "any", "methods": ["GET", "*"]}, MATCH_ALL),
        ({"name": "all"}, MATCH_ALL),
        (
            {"name": "rw", "pathRegex": "/x/.*", "methods": ["GET", "POST"]},
            HttpMatch("/x/.*", ("GET", "POST")),
        ),
        (
            {"name": "h", "headers": {"x-b": "2", "x-a": "1"}},
            HttpMatch(".*", (), (("x-a", "1"), ("x-b", "2"))),
        ),
    ],
)
def test_http_matches(raw: dict[str, object], expected: HttpMatch) -> None:
    assert http_match(smi.HTTPMatch.model_validate(raw)) == expected


def test_sources_in_another_namespace(mesh: Mesh) -> None:
    edge = target("edge-to-api", "api", "[{kind: ServiceAccount, name: client, namespace: edge}]")
    builder = mesh(docs(SHOP, edge))

    assert names(builder.build(Identity("edge", "client"), "client")) == ["shop/api:80"]
    assert builder.build(Identity("shop", "client"), "client").outbound == ()
    [port] = builder.build(API, "api").inbound
    [rule] = port.rules
    assert (rule.policy, rule.http) == ("shop/edge-to-api", (GET_ITEMS, MATCH_ALL))
    assert rule.source_spiffe_ids == ("spiffe://cluster.local/ns/edge/sa/client",)


@pytest.mark.parametrize(
    ("port", "ports_with_rules"),
    [(None, [80, 9090]), (80, [80]), (8080, [80]), (9090, [9090]), (1234, [])],
)
def test_destination_port_restricts_inbound(
    mesh: Mesh, port: int | None, ports_with_rules: list[int]
) -> None:
    api = service("api", "[{name: http, port: 80, targetPort: 8080}, {name: grpc, port: 9090}]")
    access = target("web-to-api", "api", WEB_SOURCE, version="v1alpha2", port=port)
    builder = mesh(docs(api, ROUTES, access))

    inbound = builder.build(API, "api").inbound
    assert [(p.port, p.target_port, p.protocol) for p in inbound] == [
        (80, 8080, "http"),
        (9090, 9090, "grpc"),
    ]
    assert [p.port for p in inbound if p.rules] == ports_with_rules


def test_permissive_mode_reaches_every_service_and_accepts_anyone(
    mesh: Mesh, report: Report
) -> None:
    external = report("egress/ext", location="MESH_EXTERNAL", hosts=("ext.example.com",))
    builder = mesh(docs(SHOP, PERMISSIVE), external)

    web = builder.build(WEB, "web")
    assert web.mesh.permissive
    assert names(web) == ["shop/api:80", "shop/db:5432", "shop/web:80"]
    assert all(o.routes == default_route(f"shop/{o.name}|{o.port}") for o in web.outbound)
    assert [e.host for e in web.external] == ["ext.example.com"]  # external: never outbound
    api = builder.build(API, "api")
    assert [(p.port, p.allow_any, p.rules) for p in api.inbound] == [(80, True, ())]


# -- TrafficSplit -------------------------------------------------------------------------

SPLIT_MESH = docs(
    *(service(name) for name in ("api", "api-v1", "api-v2", "api-v3")),
    ROUTES,
    split("[{service: api-v1, weight: 80}, {service: api-v2, weight: 20}, "
          "{service: api-v3, weight: 0}]"),
    WEB_TO_API,
)  # fmt: skip
BOTH = [("shop/api-v1|80", 80), ("shop/api-v2|80", 20)]
ALL_DIRECT = ["api-v1", "api-v2", "api-v3"]
ALL_BACKENDS = [f"shop/{name}" for name in ALL_DIRECT]  # run as account "api" unless mapped


@pytest.mark.parametrize(
    ("accounts", "weighted", "direct"),
    [
        pytest.param({}, BOTH, ALL_DIRECT, id="all-backends-allowed"),
        pytest.param({"shop/api-v2": "canary"}, [("shop/api-v1|80", 80)], ["api-v1", "api-v3"],
                     id="a-backend-not-allowed-is-dropped-not-re-spread"),
        pytest.param({"shop/api": "root"}, BOTH, ALL_DIRECT, id="root-not-allowed-backends-are"),
        pytest.param({"shop/api": "root", **dict.fromkeys(ALL_BACKENDS, "other")}, None, [],
                     id="nothing-allowed"),
    ],
)  # fmt: skip
def test_traffic_split_weights_over_allowed_backends(
    mesh: Mesh,
    accounts: dict[str, str],
    weighted: list[tuple[str, int]] | None,
    direct: list[str],
) -> None:
    builder = mesh(SPLIT_MESH, accounts=dict.fromkeys(ALL_BACKENDS, "api") | accounts)

    web = builder.build(WEB, "web")
    roots = [o for o in web.outbound if o.name == "api"]
    assert [o.name for o in web.outbound if o.name != "api"] == direct
    if weighted is None:
        assert roots == []
        assert web.clusters == ()
        return
    [root] = roots
    assert (root.port, root.protocol, root.hostnames) == (80, "http", hosts("api", 80))
    [route] = root.routes
    assert (route.name, route.match) == ("split", MATCH_ALL)
    assert [(c.cluster, c.weight) for c in route.clusters] == weighted
    assert root.spiffe_ids == (API_ID,)
    assert "shop/api|80" not in [r.cluster for r in route.clusters]


MATCH_GROUP = """apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: canary, namespace: shop}
spec:
  matches:
  - {name: beta, headers: {x-beta: "true"}}
  - {name: mobile, pathRegex: /m/.*}"""


CANARY = "[{kind: HTTPRouteGroup, name: canary}]"
CANARY_ROUTES = [("canary/beta", "api-v2"), ("canary/mobile", "api-v2")]


@pytest.mark.parametrize(
    ("root_account", "matches", "routes"),
    [
        pytest.param("api", CANARY, [*CANARY_ROUTES, ("default", "api")],
                     id="root-reachable-rest-goes-to-root"),
        pytest.param("root", CANARY, [*CANARY_ROUTES, ("split", "api-v2")],
                     id="root-unreachable-rest-follows-split"),
        pytest.param("api", "[{kind: HTTPRouteGroup, name: missing}]", [("split", "api-v2")],
                     id="missing-group-whole-split"),
    ],
)  # fmt: skip
def test_traffic_split_matches_split_only_matching_requests(
    mesh: Mesh, root_account: str, matches: str, routes: list[tuple[str, str]]
) -> None:
    builder = mesh(
        docs(
            service("api"),
            service("api-v2"),
            ROUTES,
            MATCH_GROUP,
            split("[{service: api-v2, weight: 100}]", matches, version="v1alpha4"),
            WEB_TO_API,
        ),
        accounts={"shop/api": root_account, "shop/api-v2": "api"},
    )

    [root] = [o for o in builder.build(WEB, "web").outbound if o.name == "api"]
    assert [(r.name, c.cluster, c.weight) for r in root.routes for c in r.clusters] == [
        (name, f"shop/{to}|80", 100) for name, to in routes
    ]
    by_name = {r.name: r.match for r in root.routes}
    if "canary/beta" in by_name:
        assert by_name["canary/beta"] == HttpMatch(".*", (), (("x-beta", "true"),))
        assert by_name["canary/mobile"] == HttpMatch("/m/.*")
    assert root.routes[-1].match == MATCH_ALL


def test_traffic_split_matches_do_not_apply_on_a_tcp_port(mesh: Mesh) -> None:
    """HTTP matches cannot select TCP connections: a TCP port takes the whole split."""
    tcp = "[{name: tcp-db, port: 5432}]"
    builder = mesh(
        docs(
            service("api", tcp),
            service("api-v2", tcp),
            MATCH_GROUP,
            split("[{service: api-v2, weight: 100}]", CANARY, version="v1alpha4"),
            PERMISSIVE,
        )
    )

    [root] = [o for o in builder.build(WEB, "web").outbound if o.name == "api"]
    assert root.protocol == "tcp"
    assert root.routes == (Route("split", MATCH_ALL, (WeightedCluster("shop/api-v2|5432", 100),)),)


# -- TCPRoutes, protocols -----------------------------------------------------------------

TCP_ROUTES = """apiVersion: specs.smi-spec.io/v1alpha4
kind: TCPRoute
metadata: {name: db-port, namespace: shop}
spec: {matches: {ports: [5432]}}
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: TCPRoute
metadata: {name: db-target, namespace: shop}
spec: {matches: {ports: [15432]}}
---
apiVersion: specs.smi-spec.io/v1alpha3
kind: TCPRoute
metadata: {name: all-ports, namespace: shop}"""


@pytest.mark.parametrize(
    ("destination", "rule", "expected"),
    [
        pytest.param("db", "TCPRoute, name: db-port", {5432: ((), (15432,))}, id="port-listed"),
        pytest.param("db", "TCPRoute, name: db-target", {5432: ((), (15432,))},
                     id="target-port-listed"),
        pytest.param("db", "TCPRoute, name: all-ports", {5432: ((), (15432,)), 7000: ((), (7000,))},
                     id="all-ports"),
        pytest.param("db", "HTTPRouteGroup, name: api-routes", {}, id="http-rule-on-tcp-port"),
        pytest.param("api", "TCPRoute, name: all-ports", {80: ((MATCH_ALL,), ())},
                     id="tcp-rule-on-http-port-allows-every-request"),
        pytest.param("api", "TCPRoute, name: db-port", {}, id="tcp-rule-other-port"),
    ],
)  # fmt: skip
def test_tcp_routes(
    mesh: Mesh,
    destination: str,
    rule: str,
    expected: dict[int, tuple[tuple[HttpMatch, ...], tuple[int, ...]]],
) -> None:
    db = service(
        "db", "[{name: tcp-db, port: 5432, targetPort: 15432}, {name: tcp-admin, port: 7000}]"
    )
    api = service("api", "[{name: http, port: 80, targetPort: 8080}]")
    access = target("web-to", destination, WEB_SOURCE, f"[{{kind: {rule}}}]")  # fmt: skip
    builder = mesh(docs(db, api, ROUTES, TCP_ROUTES, access))

    inbound = builder.build(Identity("shop", destination), destination).inbound
    found = {p.port: (p.rules[0].http, p.rules[0].tcp_ports) for p in inbound if p.rules}
    assert found == expected
    assert all(r.policy == "shop/web-to" for p in inbound for r in p.rules)


@pytest.mark.parametrize(
    ("port", "protocol"),
    [
        ("{name: http, port: 80}", "http"),
        ("{name: http-web, port: 80}", "http"),
        ("{name: grpc, port: 80}", "grpc"),
        ("{name: grpc-api, port: 80}", "grpc"),
        ("{name: tcp-raw, port: 80}", "tcp"),
        ("{name: http2, port: 80}", "http2"),
        ("{name: mysql, port: 80}", "http"),
        ("{port: 80}", "http"),
        ("{name: web, port: 80, appProtocol: grpc}", "grpc"),
        ("{name: http, port: 80, appProtocol: tcp}", "tcp"),
        ("{name: web, port: 80, appProtocol: kubernetes.io/h2c}", "http2"),
        ("{name: web, port: 80, appProtocol: postgresql}", "tcp"),
    ],
)
def test_protocol_from_port_name_and_app_protocol(mesh: Mesh, port: str, protocol: str) -> None:
    builder = mesh(docs(service("api", f"[{port}]"), service("web"), PERMISSIVE))

    [outbound] = [o for o in builder.build(WEB, "web").outbound if o.name == "api"]
    assert outbound.protocol == protocol
    assert builder.build(WEB, "web").clusters[0].protocol == protocol
    assert builder.build(API, "api").inbound[0].protocol == protocol


# -- ServiceEntries -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("export_to", "namespace", "visible"),
    [
        ((), "shop", True),
        ((".",), "egress", True),
        ((".",), "shop", False),
        (("*",), "shop", True),
        (("shop",), "shop", True),
        (("shop",), "other", False),
        (("~",), "egress", False),
        (("~",), "shop", False),
    ],
)
def test_mesh_external_service_entries_respect_export_to(
    mesh: Mesh, report: Report, export_to: tuple[str, ...], namespace: str, visible: bool
) -> None:
    payments = report(
        "egress/payments",
        ports=[("https", 443, "HTTPS"), ("http", 80, "HTTP")],
        location="MESH_EXTERNAL",
        resolution="DNS",
        hosts=("payments.example.com", "pay.example.com"),
        addresses=("192.0.2.0/24",),
        export_to=export_to,
    )
    builder = mesh(PERMISSIVE, payments)

    policy = builder.build(Identity(namespace, "client"), "client")
    assert policy.outbound == ()  # an external service is never an outbound destination
    if not visible:
        assert policy.external == ()
        assert policy.clusters == ()
        return
    assert policy.external == tuple(
        ExternalService(host, port, protocol, f"egress/payments|{port}", ("192.0.2.0/24",),
                        "egress/payments")
        for host, port, protocol in [
            ("pay.example.com", 80, "http"),
            ("pay.example.com", 443, "https"),  # told apart by SNI
            ("payments.example.com", 80, "http"),
            ("payments.example.com", 443, "https"),  # told apart by SNI
        ]
    )  # fmt: skip
    assert [(c.name, c.discovery, c.mesh_tls) for c in policy.clusters] == [
        ("egress/payments|443", "DNS", False),
        ("egress/payments|80", "DNS", False),
    ]


@pytest.mark.parametrize("allowed", [True, False])
def test_mesh_internal_service_entry_host_is_an_outbound_destination(
    mesh: Mesh, report: Report, endpoint: Endpoint, allowed: bool
) -> None:
    legacy = report(
        "shop/legacy",
        endpoint("10.0.0.9", {"http": 8080}, service_account="legacy"),
        ports=[("http", 8080, "HTTP")],
        location="MESH_INTERNAL",
        resolution="STATIC",
        hosts=("legacy.corp.internal",),
    )
    access = target("web-to-legacy", "legacy", WEB_SOURCE)
    builder = mesh(docs(SHOP, access) if allowed else SHOP, legacy)

    web = builder.build(WEB, "web")
    assert web.external == ()
    if not allowed:  # deny by default applies to entries of the mesh too
        assert web.outbound == ()
        return
    [outbound] = web.outbound
    assert outbound == OutboundService(
        "shop", "legacy", 8080, "http", ("legacy.corp.internal", "legacy.corp.internal:8080"),
        default_route("shop/legacy|8080"), ("spiffe://cluster.local/ns/shop/sa/legacy",),
    )  # fmt: skip
    [cluster] = web.clusters
    assert (cluster.discovery, cluster.mesh_tls) == ("STATIC", True)


# -- trust domain, unknown references ------------------------------------------------------

TRELLIS_CONFIG = """apiVersion: config.trellis.io/v1alpha1
kind: MeshConfig
metadata: {name: mesh, namespace: trellis-system}
spec: {trustDomain: corp.example}"""
OSM_CONFIG = PERMISSIVE.replace("true", "false")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ([], "mesh.example"),
        ([OSM_CONFIG], "mesh.example"),  # OSM's MeshConfig has no trust domain
        ([TRELLIS_CONFIG], "corp.example"),
    ],
)
def test_trust_domain_of_spiffe_ids(mesh: Mesh, config: list[str], expected: str) -> None:
    builder = mesh(docs(SHOP, WEB_TO_API, *config), trust_domain="mesh.example")

    web = builder.build(WEB, "web")
    assert web.spiffe_id == f"spiffe://{expected}/ns/shop/sa/web"
    assert web.mesh.trust_domain == expected
    assert web.outbound[0].spiffe_ids == (f"spiffe://{expected}/ns/shop/sa/api",)
    [port] = builder.build(API, "api").inbound
    assert port.rules[0].source_spiffe_ids == (f"spiffe://{expected}/ns/shop/sa/web",)


def test_unknown_references_never_raise(mesh: Mesh) -> None:
    builder = mesh(
        docs(
            SHOP,
            split("[{service: ghost-v1, weight: 1}, {service: api, weight: 1}]",
                  "[{kind: HTTPRouteGroup, name: missing}]", version="v1alpha4", root="ghost"),
            target("to-nobody", "nobody", WEB_SOURCE),
            target("broken", "api", WEB_SOURCE, "[{kind: TCPRoute, name: gone}]"),
            target("from-afar", "api", "[{kind: ServiceAccount, name: x, namespace: nowhere}]"),
            WEB_TO_API,
        )
    )  # fmt: skip

    web = builder.build(WEB, "web")
    assert names(web) == ["shop/api:80", "shop/ghost:80"]  # ghost: split to its known backend
    [ghost] = [o for o in web.outbound if o.name == "ghost"]
    assert ghost.routes == (Route("split", MATCH_ALL, (WeightedCluster("shop/api|80", 1),)),)
    unknown = builder.build(Identity("nowhere", "ghost"), "ghost")
    assert unknown.inbound == ()
    assert unknown.outbound == ()
    [port] = builder.build(API, "api").inbound
    assert [r.policy for r in port.rules] == ["shop/from-afar", "shop/web-to-api"]


@pytest.mark.parametrize(
    ("backend", "expected"),
    [
        pytest.param([], ["shop/web:80"], id="unknown-backend-nothing-to-route-to-yet"),
        pytest.param([service("api-v9", "[{name: http, port: 81}]")],
                     ["shop/api:81", "shop/api-v9:81", "shop/web:80"],
                     id="root-takes-backend-ports"),
    ],
)  # fmt: skip
def test_split_of_a_root_without_ports(mesh: Mesh, backend: list[str], expected: list[str]) -> None:
    headless = "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\n"
    headless += "spec: {clusterIP: None}"
    split_to_v9 = split("[{service: api-v9, weight: 1}]")
    builder = mesh(docs(headless, service("web"), split_to_v9, PERMISSIVE, *backend))  # fmt: skip

    assert names(builder.build(WEB, "web")) == expected


def test_a_split_backend_without_the_roots_port_is_skipped_and_the_rest_share_it(
    mesh: Mesh,
) -> None:
    # OSM skips such a backend; the others' weights are relative, so they take its share
    builder = mesh(
        docs(
            service("api"),
            service("web"),
            service("api-v1"),
            service("api-v2"),
            service("api-v3", "[{name: http, port: 8080}]"),  # not the root's 80
            split(
                "[{service: api-v1, weight: 50}, {service: api-v2, weight: 25},"
                " {service: api-v3, weight: 25}]"
            ),
            PERMISSIVE,
        )
    )

    [root] = [o for o in builder.build(WEB, "web").outbound if o.name == "api"]
    [route] = root.routes
    assert [(c.cluster, c.weight) for c in route.clusters] == [
        ("shop/api-v1|80", 50),
        ("shop/api-v2|80", 25),
    ]


# -- explain ------------------------------------------------------------------------------

EXPLAIN_MESH = docs(
    service("api"),
    service("api-v1"),
    service("db", "[{name: tcp-db, port: 5432}]"),
    ROUTES,
    TCP_ROUTES,
    split("[{service: api-v1, weight: 1}]"),
    WEB_TO_API,
    target("web-to-db", "db", WEB_SOURCE, "[{kind: TCPRoute, name: db-port}]"),
)


DENIED = (
    "no TrafficTarget lets service account shop/thief call shop/api (the account of shop/api-v1); "
    "traffic is denied by default"
)
DENIED_SPLIT = (
    "shop/api is split by TrafficSplit shop/api-split and no TrafficTarget lets shop/thief call "
    "any of its backends"
)


@pytest.mark.parametrize(
    ("source", "destination", "allowed", "reason", "policies", "routes"),
    [
        pytest.param("web", "api-v1", True, "allowed to shop/api by TrafficTarget shop/web-to-api",
                     ("shop/web-to-api",), (GET_ITEMS, MATCH_ALL), id="allowed-http"),
        pytest.param("web", "db", True, "allowed to shop/db by TrafficTarget shop/web-to-db",
                     ("shop/web-to-db",), (MATCH_ALL,), id="allowed-tcp"),
        pytest.param("thief", "api-v1", False, DENIED, (), (), id="denied"),
        pytest.param("web", "api", True, "through TrafficSplit shop/api-split",
                     ("shop/web-to-api",), (GET_ITEMS, MATCH_ALL), id="via-split"),
        pytest.param("thief", "api", False, DENIED_SPLIT, (), (), id="denied-via-split"),
        pytest.param("web", "ghost", False, "service shop/ghost is not known to the mesh", (), (),
                     id="unknown-service"),
    ],
)  # fmt: skip
def test_explain(
    mesh: Mesh,
    source: str,
    destination: str,
    allowed: bool,
    reason: str,
    policies: tuple[str, ...],
    routes: tuple[HttpMatch, ...],
) -> None:
    builder = mesh(EXPLAIN_MESH, accounts={"shop/api-v1": "api"})

    decision = explain(builder, ServiceAccount("shop", source), MeshService("shop", destination))
    assert (decision.allowed, decision.reason) == (allowed, reason)
    assert (decision.policies, decision.routes) == (policies, routes)
    assert not decision.permissive


def test_explain_in_permissive_mode(mesh: Mesh) -> None:
    builder = mesh(docs(EXPLAIN_MESH, PERMISSIVE))

    decision = explain(builder, ServiceAccount("shop", "thief"), MeshService("shop", "api-v1"))
    assert decision.allowed
    assert decision.permissive
    assert "permissive traffic policy mode is on" in decision.reason
    unknown = explain(builder, ServiceAccount("shop", "thief"), MeshService("shop", "ghost"))
    assert not unknown.allowed  # permissive mode does not invent services


# -- endpoints by service account (OSM) --------------------------------------------------


def test_a_client_reaches_only_the_endpoints_whose_account_it_may_call(
    mesh: Mesh, report: Report, endpoint: Endpoint
) -> None:
    """api's workloads run as two accounts; the TrafficTarget allows web to call one of
    them. OSM sends web only that account's endpoints (else a share of its requests would
    meet the other account's RBAC)."""
    api = report(
        "shop/api",
        endpoint("10.0.0.1", {"http": 8080}, service_account="api"),
        endpoint("10.0.0.2", {"http": 8080}, service_account="api-canary"),
        endpoint("10.0.0.3", {"http": 8080}),
    )
    builder = mesh(docs(SHOP, WEB_TO_API), api, accounts={"shop/api": "api"})
    web = builder.build(WEB, "web")
    [ref] = [c for c in web.clusters if c.name == "shop/api|80"]
    assert ref.accounts == ("", "api")  # "": the endpoint naming none runs as the service's
    canary = target("web-to-canary", "api-canary", WEB_SOURCE)
    both = mesh(docs(SHOP, WEB_TO_API, canary), api, accounts={"shop/api": "api"})
    [ref] = [c for c in both.build(WEB, "web").clusters if c.name == "shop/api|80"]
    assert ref.accounts == ()  # all of them: no filter
    only_canary = mesh(docs(SHOP, canary), api, accounts={"shop/api": "api"})
    [ref] = [c for c in only_canary.build(WEB, "web").clusters if c.name == "shop/api|80"]
    assert ref.accounts == ("api-canary",)  # callable through a minority account too
    permissive = mesh(docs(SHOP, PERMISSIVE), api, accounts={"shop/api": "api"})
    assert all(c.accounts == () for c in permissive.build(WEB, "web").clusters)


# -- TCP services on one port (OSM) ------------------------------------------------------


def test_a_split_root_takes_a_shared_tcp_port_and_the_others_are_marked(mesh: Mesh) -> None:
    tcp = "[{name: tcp-db, port: 5432}]"
    builder = mesh(
        docs(
            service("store", tcp),
            service("db-v1", tcp),
            service("cache", tcp),
            split("[{service: db-v1, weight: 100}]", root="store"),
            PERMISSIVE,
        )
    )
    outbound = {o.name: o for o in builder.build(WEB, "web").outbound if o.port == 5432}
    # "cache" and "db-v1" come first by name, yet the split root takes the port
    assert {name: o.shadowed_by for name, o in outbound.items()} == {
        "cache": "shop/store",
        "db-v1": "shop/store",
        "store": "",
    }
    decision = explain(builder, ServiceAccount("shop", "web"), MeshService("shop", "cache"))
    assert decision.allowed
    assert decision.conflicts == (
        "TCP port 5432: shop/web reaches shop/store on it, not shop/cache (shop/store takes "
        "precedence: a TrafficSplit root first, then by name)",
    )
    assert (
        explain(builder, ServiceAccount("shop", "web"), MeshService("shop", "store")).conflicts
        == ()
    )


def test_without_a_split_the_first_tcp_service_by_name_takes_the_port(mesh: Mesh) -> None:
    tcp = "[{name: tcp-db, port: 5432}]"
    builder = mesh(docs(service("b-db", tcp), service("a-db", tcp), PERMISSIVE))
    outbound = {o.name: o.shadowed_by for o in builder.build(WEB, "web").outbound if o.port == 5432}
    assert outbound == {"a-db": "", "b-db": "shop/a-db"}


def test_meshconfig_tracing_reaches_every_view(mesh: Mesh) -> None:
    traced = PERMISSIVE.replace(
        "featureFlags: {ignored: true}}",
        "featureFlags: {ignored: true}, observability: {tracing: {enable: true, "
        "address: zipkin.tracing, port: 9411, endpoint: /api/v2/spans}}}",
    )
    builder = mesh(docs(SHOP, traced))
    assert builder.build(WEB, "web").mesh.tracing == Tracing(
        "zipkin.tracing", 9411, "/api/v2/spans"
    )
    assert mesh(docs(SHOP, PERMISSIVE)).build(WEB, "web").mesh.tracing is None
