"""OSM Egress in the catalog: what an identity may reach outside the mesh, and the statuses
that say why not. (IngressBackend, what an inbound port admits from outside: test_ingress.)"""

from __future__ import annotations

from collections.abc import Callable

from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import (
    ConnectionSettings,
    EgressRoute,
    HttpMatch,
    Identity,
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
