"""OSM Egress and IngressBackend in the catalog: what an identity may reach outside the mesh,
what an inbound port admits from outside it, and the statuses that say why not."""

from __future__ import annotations

from collections.abc import Callable

from trellis_catalog.domain import edge
from trellis_catalog.domain.policy import PolicyBuilder
from trellis_catalog.domain.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.views import (
    ConnectionSettings,
    EgressRoute,
    HttpMatch,
    Identity,
    IngressRule,
)
from trellis_common.documents.base import Document, DocumentError
from trellis_spec.egress import egress_statuses

Mesh = Callable[..., PolicyBuilder]
Report = Callable[..., ProvidedService]
Endpoint = Callable[..., ProvidedEndpoint]

BASE = """apiVersion: v1
kind: Service
metadata: {name: curl, namespace: curl}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: curl}
spec: {ports: [{name: http, port: 80}]}
"""


def egress(name: str = "httpbin", extra: str = "", source: str = "curl") -> str:
    return f"""---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Egress
metadata: {{name: {name}, namespace: curl}}
spec:
  sources: [{{kind: ServiceAccount, name: {source}, namespace: curl}}]
{extra}"""


GROUP = """---
apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: get-only, namespace: curl}
spec:
  matches: [{name: get, pathRegex: /get, methods: [GET]}]
"""


def test_an_http_egress_allows_its_hosts_on_its_port_narrowed_by_its_route_groups(
    mesh: Mesh,
) -> None:
    text = (
        BASE
        + GROUP
        + egress(
            extra="  hosts: [HTTPBin.org]\n  ports: [{number: 80, protocol: HTTP}]\n"
            "  matches: [{apiGroup: specs.smi-spec.io/v1alpha4, kind: HTTPRouteGroup, "
            "name: get-only}]\n"
        )
    )
    builder = mesh(text)
    assert builder.build(Identity("curl", "curl"), "curl").egress == (
        EgressRoute(
            policies=("curl/httpbin",),
            protocol="http",
            port=80,
            host="httpbin.org",
            matches=(HttpMatch("/get", ("GET",)),),
        ),
    )
    assert builder.build(Identity("curl", "web"), "web").egress == ()  # not a source
    assert builder.spec.statuses["Egress curl/httpbin"].state == "valid"


def test_policies_merge_per_host_and_port_and_one_without_matches_allows_everything(
    mesh: Mesh,
) -> None:
    ports = "  hosts: [httpbin.org]\n  ports: [{number: 80, protocol: http}]\n"
    narrowed = ports + (
        "  matches: [{apiGroup: specs.smi-spec.io/v1alpha4, kind: HTTPRouteGroup, "
        "name: get-only}]\n"
    )
    builder = mesh(BASE + GROUP + egress("a", narrowed) + egress("b", ports))
    (route,) = builder.build(Identity("curl", "curl"), "curl").egress
    assert route.policies == ("curl/a", "curl/b")
    assert route.matches == ()  # b allows every request


def test_tcp_and_https_without_hosts_go_by_address_ranges(mesh: Mesh) -> None:
    extra = (
        "  hosts: [api.example.com]\n  ipAddresses: [10.0.0.7/24, 192.168.1.1/32]\n"
        "  ports: [{number: 5432, protocol: tcp-server-first}, {number: 443, protocol: https}]\n"
    )
    bare = "  ports: [{number: 6379, protocol: tcp}]\n"
    routes = mesh(BASE + egress("db", extra) + egress("redis", bare)).build(
        Identity("curl", "curl"), "curl"
    )
    assert routes.egress == (
        EgressRoute(("curl/db",), "https", 443, "api.example.com"),
        EgressRoute(("curl/db",), "tcp", 5432, ip_ranges=("10.0.0.0/24", "192.168.1.1/32")),
        EgressRoute(("curl/redis",), "tcp", 6379),  # no ranges: any address
    )


def test_egress_has_no_effect_while_mesh_config_lets_everything_out(mesh: Mesh) -> None:
    config = """---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: osm-system}
spec: {traffic: {enableEgress: true}}
"""
    extra = "  hosts: [httpbin.org]\n  ports: [{number: 80, protocol: http}]\n"
    builder = mesh(BASE + config + egress(extra=extra))
    assert builder.build(Identity("curl", "curl"), "curl").egress == ()
    status = egress_statuses(builder.spec, builder.spec.statuses)["Egress curl/httpbin"]
    assert status.state == "warning"
    assert "traffic.enableEgress is on" in status.reason


def test_a_missing_traffic_setting_voids_the_egress_and_a_present_one_sets_its_clusters(
    mesh: Mesh,
) -> None:
    extra = (
        "  hosts: [httpbin.org]\n  ports: [{number: 80, protocol: http}]\n"
        "  matches: [{apiGroup: policy.openservicemesh.io/v1alpha1, "
        "kind: UpstreamTrafficSetting, name: httpbin}]\n"
    )
    builder = mesh(BASE + egress(extra=extra))
    assert builder.build(Identity("curl", "curl"), "curl").egress == ()
    status = egress_statuses(builder.spec, builder.spec.statuses)["Egress curl/httpbin"]
    assert status.state == "error"
    assert "UpstreamTrafficSetting curl/httpbin (spec.matches) not found" in status.reason

    setting = """---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: UpstreamTrafficSetting
metadata: {name: httpbin, namespace: curl}
spec:
  host: httpbin.org
  connectionSettings: {http: {maxRequests: 3}}
"""
    builder = mesh(BASE + egress(extra=extra) + setting)
    (route,) = builder.build(Identity("curl", "curl"), "curl").egress
    assert route.connection == ConnectionSettings(policy="curl/httpbin", max_requests=3)
    resolved = egress_statuses(builder.spec, builder.spec.statuses)
    assert "Egress curl/httpbin" not in resolved  # valid as it was
    assert resolved["UpstreamTrafficSetting curl/httpbin"].state == "valid"
    assert resolved["UpstreamTrafficSetting curl/httpbin"].reason == (
        "applies to the hosts of Egress curl/httpbin"
    )


def test_missing_route_groups_allow_nothing_and_say_so(mesh: Mesh) -> None:
    extra = (
        "  hosts: [httpbin.org]\n  ports: [{number: 80, protocol: http}]\n"
        "  matches: [{apiGroup: specs.smi-spec.io/v1alpha4, kind: HTTPRouteGroup, name: gone}]\n"
    )
    builder = mesh(BASE + egress(extra=extra))
    assert builder.build(Identity("curl", "curl"), "curl").egress == ()
    status = egress_statuses(builder.spec, builder.spec.statuses)["Egress curl/httpbin"]
    assert status.state == "warning"
    assert "HTTPRouteGroup(s) curl/gone (spec.matches) not found" in status.reason


def test_a_service_entry_for_the_same_host_and_port_is_named_in_the_status(mesh: Mesh) -> None:
    entry = """---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: httpbin, namespace: curl}
spec:
  hosts: [httpbin.org]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: DNS
"""
    extra = "  hosts: [httpbin.org]\n  ports: [{number: 80, protocol: http}]\n"
    builder = mesh(BASE + entry + egress(extra=extra))
    status = egress_statuses(builder.spec, builder.spec.statuses)["Egress curl/httpbin"]
    assert "httpbin.org:80 is also ServiceEntry curl/httpbin's (MESH_EXTERNAL)" in status.reason


def test_egress_documents_name_the_field_in_every_error(
    docs_and_errors: Callable[[str], tuple[list[Document], list[DocumentError]]],
) -> None:
    cases = {
        "  hosts: [httpbin.org]\n  ports: [{number: 80, protocol: udp}]\n": (
            "spec.ports[0].protocol",
            "must be one of http, https, tcp, tcp-server-first",
        ),
        "  ports: [{number: 80, protocol: http}]\n": (
            "spec.ports[0].protocol",
            "spec.hosts must name at least one",
        ),
        "  ipAddresses: [10.0.0.0]\n  ports: [{number: 1, protocol: tcp}]\n": (
            "spec.ipAddresses[0]",
            "must be an IPv4 CIDR",
        ),
        "  hosts: ['http://httpbin.org']\n  ports: [{number: 80, protocol: http}]\n": (
            "spec.hosts[0]",
            "no scheme, port or path",
        ),
        "  hosts: [a.b]\n  ports: []\n": ("spec.ports", "must list at least one port"),
    }
    for extra, (field, reason) in cases.items():
        _, errors = docs_and_errors(egress(extra=extra))
        assert [e.field for e in errors] == [field], extra
        assert reason in errors[0].reason, extra


# -- IngressBackend ---------------------------------------------------------------------


def backend(protocol: str = "http", sources: str = "", name: str = "httpbin") -> str:
    return f"""---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: IngressBackend
metadata: {{name: {name}, namespace: shop}}
spec:
  backends: [{{name: api, port: {{number: 8080, protocol: {protocol}}}}}]
  sources:
{sources or "  - {kind: IPRange, name: 10.1.2.3/8}"}
"""


SHOP = """apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec: {ports: [{name: http, port: 80, targetPort: 8080}]}
"""


def test_an_http_backend_admits_plaintext_from_its_ranges_and_source_services(
    mesh: Mesh, report: Report, endpoint: Endpoint
) -> None:
    sources = (
        "  - {kind: IPRange, name: 10.1.2.3/8}\n"
        "  - {kind: Service, name: nginx, namespace: ingress}\n"
    )
    builder = mesh(
        SHOP + backend(sources=sources),
        report("shop/api", endpoint("10.0.0.1", {"http": 8080})),
        report("ingress/nginx", endpoint("10.9.9.9", {"http": 80})),
    )
    (port,) = builder.build(Identity("shop", "api"), "api").inbound
    assert port.ingress == IngressRule(
        policy="shop/httpbin", protocol="http", source_ranges=("10.0.0.0/8", "10.9.9.9/32")
    )


def test_a_source_service_without_endpoints_voids_the_backend_as_in_osm(
    mesh: Mesh, report: Report, endpoint: Endpoint
) -> None:
    sources = "  - {kind: Service, name: nginx, namespace: ingress}\n"
    builder = mesh(
        SHOP + backend(sources=sources), report("shop/api", endpoint("10.0.0.1", {"http": 8080}))
    )
    (port,) = builder.build(Identity("shop", "api"), "api").inbound
    assert port.ingress is None
    statuses = edge.statuses(builder.spec, builder.services, builder.spec.statuses)
    assert statuses["IngressBackend shop/httpbin"].state == "error"
    assert "endpoints not found for source service(s) ingress/nginx" in (
        statuses["IngressBackend shop/httpbin"].reason
    )


def test_an_https_backend_admits_named_principals_and_the_first_policy_takes_a_port(
    mesh: Mesh, report: Report, endpoint: Endpoint
) -> None:
    sources = (
        "  - {kind: AuthenticatedPrincipal, name: nginx.ingress.cluster.local}\n"
        "  - {kind: IPRange, name: 10.0.0.0/8}\n"
    )
    builder = mesh(
        SHOP + backend("https", sources, "a-first") + backend(name="b-second"),
        report("shop/api", endpoint("10.0.0.1", {"http": 8080})),
    )
    (port,) = builder.build(Identity("shop", "api"), "api").inbound
    assert port.ingress == IngressRule(
        policy="shop/a-first",
        protocol="https",
        source_ranges=("10.0.0.0/8",),
        principals=("nginx.ingress.cluster.local",),
    )
    statuses = edge.statuses(builder.spec, builder.services, builder.spec.statuses)
    assert "IngressBackend shop/a-first" not in statuses  # valid as it was
    assert "IngressBackend shop/a-first already admits traffic to api:8080" in (
        statuses["IngressBackend shop/b-second"].reason
    )


def test_a_backend_port_that_the_service_lacks_is_reported(
    mesh: Mesh, report: Report, endpoint: Endpoint
) -> None:
    text = SHOP.replace("targetPort: 8080", "targetPort: 9090") + backend()
    builder = mesh(text, report("shop/api", endpoint("10.0.0.1", {"http": 9090})))
    (port,) = builder.build(Identity("shop", "api"), "api").inbound
    assert port.ingress is None
    statuses = edge.statuses(builder.spec, builder.services, builder.spec.statuses)
    assert "spec.backends[0].port.number: 8080 is no port of shop/api" in (
        statuses["IngressBackend shop/httpbin"].reason
    )


def test_ingress_documents_name_the_field_in_every_error(
    docs_and_errors: Callable[[str], tuple[list[Document], list[DocumentError]]],
) -> None:
    cases = {
        backend(sources="  - {kind: IPRange, name: nowhere}"): (
            "spec.sources[0].name",
            "must be an IPv4 CIDR",
        ),
        backend(sources="  - {kind: Service, name: nginx}"): (
            "spec.sources[0].namespace",
            "is required for a source of kind Service",
        ),
        backend(protocol="grpc"): ("spec.backends[0].port.protocol", "must be one of http, https"),
        backend(sources="  - {kind: Pod, name: x}"): ("spec.sources[0].kind", "Service"),
    }
    for text, (field, reason) in cases.items():
        _, errors = docs_and_errors(text)
        assert [e.field for e in errors] == [field], text
        assert reason in errors[0].reason, text


def test_skipping_client_certificates_needs_something_to_tell_them_from_the_mesh(
    mesh: Mesh, report: Report, endpoint: Endpoint
) -> None:
    tls = "  backends: [{name: api, port: {number: 8080, protocol: https},"
    skipping = " tls: {skipClientCertValidation: true}}]\n"
    sources = "  - {kind: AuthenticatedPrincipal, name: nginx}\n"
    text = SHOP + backend(sources=sources).replace(
        "  backends: [{name: api, port: {number: 8080, protocol: http}}]\n", tls + skipping
    )
    api = report("shop/api", endpoint("10.0.0.1", {"http": 8080}))
    builder = mesh(text, api)
    (port,) = builder.build(Identity("shop", "api"), "api").inbound
    assert port.ingress is not None
    assert not port.ingress.skip_client_cert_validation
    statuses = edge.statuses(builder.spec, builder.services, builder.spec.statuses)
    assert "tls.skipClientCertValidation is not applied" in (
        statuses["IngressBackend shop/httpbin"].reason
    )

    ranged = text.replace(sources, sources + "  - {kind: IPRange, name: 10.0.0.0/8}\n")
    (port,) = mesh(ranged, api).build(Identity("shop", "api"), "api").inbound
    assert port.ingress is not None
    assert port.ingress.skip_client_cert_validation
