"""Known services: declared Services merged with provider reports, and their clusters."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trellis_catalog.domain.index import services
from trellis_catalog.domain.index.services import (
    KnownService,
    PortSpec,
    ProvidedEndpoint,
    ProvidedService,
)
from trellis_catalog.domain.model.views import ClusterEndpoint
from trellis_common.documents.base import Document
from trellis_common.model import MeshService
from trellis_spec.mesh import build

Docs = Callable[[str], list[Document]]
Endpoint = Callable[..., ProvidedEndpoint]
Report = Callable[..., ProvidedService]

API = MeshService("shop", "api")
TWO_PORTS = """
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec:
  ports:
  - {name: http, port: 80, targetPort: web}
  - {name: grpc, port: 9090}
  - {name: dns, port: 53, protocol: UDP}
"""


def _known(docs: Docs, text: str, *reports: ProvidedService) -> dict[MeshService, KnownService]:
    return services.index(build(docs(text)).services, reports)


@pytest.mark.parametrize(
    ("ports", "port", "single", "expected"),
    [
        pytest.param({"web": 9000, "http": 8000}, PortSpec(80, "web", "http", "http"), False, 9000,
                     id="target-port-names-a-workload-port"),
        pytest.param({"http": 8000}, PortSpec(80, "web", "http", "http"), True, None,
                     id="named-target-port-missing"),
        pytest.param({"http": 8000, "metrics": 9100}, PortSpec(80, 8080, "http", "http"), False,
                     8000, id="port-own-name"),
        pytest.param({"": 8080}, PortSpec(80, 80, "http", "http"), True, 8080,
                     id="bare-number-serves-the-only-port"),
        pytest.param({"": 8080}, PortSpec(80, 80, "http", "http"), False, None,
                     id="bare-number-not-one-of-two-ports"),
        pytest.param({"": 8080}, PortSpec(80, 80, "", "http"), False, None,
                     id="bare-number-not-an-unnamed-port-of-several"),
        pytest.param({}, PortSpec(80, 8080, "http", "http"), False, 8080,
                     id="no-ports-numeric-target"),
        pytest.param({"admin": 7000, "metrics": 9100}, PortSpec(80, 8080, "http", "http"), True,
                     None, id="several-ports-none-named"),
    ],
)  # fmt: skip
def test_endpoint_port(
    endpoint: Endpoint,
    ports: dict[str, int],
    port: PortSpec,
    single: bool,
    expected: int | None,
) -> None:
    assert services.endpoint_port(endpoint("10.0.0.1", ports), port, single) == expected


def test_cluster_takes_each_endpoint_port_by_name_and_leaves_out_who_lacks_it(
    docs: Docs, endpoint: Endpoint, report: Report
) -> None:
    both = endpoint("10.0.0.1", {"web": 8080, "grpc": 9091}, service_account="api")
    web_only = endpoint("10.0.0.2", {"web": 8081}, service_account="api")
    known = _known(docs, TWO_PORTS, report("shop/api", both, web_only))[API]

    assert [(p.port, p.target, p.name, p.protocol) for p in known.ports] == [
        (80, "web", "http", "http"),
        (9090, 9090, "grpc", "grpc"),
    ]  # UDP is not proxied
    http, grpc = (services.cluster(known, p, "cluster.local") for p in known.ports)
    assert [(e.address, e.port) for e in http.endpoints] == [("10.0.0.1", 8080), ("10.0.0.2", 8081)]
    assert [(e.address, e.port) for e in grpc.endpoints] == [("10.0.0.1", 9091)]
    assert http.ref.name == "shop/api|80"
    assert grpc.ref.name == "shop/api|9090"
    assert (grpc.ref.port, grpc.ref.protocol, grpc.ref.discovery) == (9090, "grpc", "STATIC")


@pytest.mark.parametrize(
    ("text", "served"),
    [
        pytest.param(
            "spec: {ports: [{name: http, port: 80}]}", [8080], id="one-port-served-by-bare-number"
        ),
        pytest.param(
            "spec: {ports: [{name: http, port: 80}, {name: admin, port: 81}]}",
            [],
            id="two-ports-not-served-by-bare-number",
        ),
    ],
)
def test_bare_number_workload_serves_only_a_single_port_service(
    docs: Docs, endpoint: Endpoint, report: Report, text: str, served: list[int]
) -> None:
    declared = "apiVersion: v1\nkind: Service\nmetadata: {name: api, namespace: shop}\n" + text
    known = _known(docs, declared, report("shop/api", endpoint("10.0.0.1", {"": 8080})))[API]

    for port in known.ports:
        state = services.cluster(known, port, "cluster.local")
        assert [e.port for e in state.endpoints] == served


def test_provider_only_service_takes_its_ports_from_the_provider(
    docs: Docs, endpoint: Endpoint, report: Report
) -> None:
    ports = [
        ("http", 80, "HTTP"),
        ("grpc-api", 90, ""),  # no protocol: from the port name's prefix
        ("tcp-db", 91, ""),
        ("db", 5432, "TCP"),
        ("tls", 443, "HTTPS"),  # not parsed by the proxy: TCP
        ("h2", 8443, "HTTP2"),
        ("rpc", 9000, "GRPC"),
        ("", 81, ""),  # neither: HTTP, as OSM
        ("admin", 82, "", 8082),
    ]
    reported = report("shop/legacy", endpoint("10.0.0.1", {"http": 8080}), ports=ports)
    known = services.index({}, [reported])[MeshService("shop", "legacy")]

    assert not known.declared
    assert known.providers == ("vm",)
    assert [(p.port, p.protocol, p.target) for p in known.ports] == [
        (80, "http", "http"),
        (81, "http", 81),
        (82, "http", 8082),
        (90, "grpc", "grpc-api"),
        (91, "tcp", "tcp-db"),
        (443, "tcp", "tls"),
        (5432, "tcp", "db"),
        (8443, "http2", "h2"),
        (9000, "grpc", "rpc"),
    ]
    http = services.cluster(known, known.ports[0], "cluster.local")
    assert [(e.address, e.port) for e in http.endpoints] == [("10.0.0.1", 8080)]


def test_declared_ports_win_over_reported_ones(
    docs: Docs, endpoint: Endpoint, report: Report
) -> None:
    reported = report("shop/api", endpoint("10.0.0.1", {"web": 8080}), ports=[("other", 7000)])
    known = _known(docs, TWO_PORTS, reported)[API]

    assert [p.port for p in known.ports] == [80, 9090]
    assert known.declared


def test_cluster_spiffe_ids_come_from_the_endpoints_service_accounts(
    endpoint: Endpoint, report: Report
) -> None:
    reported = report(
        "shop/api",
        endpoint("10.0.0.1", {"http": 8080}, service_account="api"),
        endpoint("10.0.0.2", {"http": 8080}, service_account="api-canary"),
        endpoint("10.0.0.3", {"http": 8080}, service_account="api"),
        endpoint("10.0.0.4", {"http": 8080}),
        endpoint("10.0.0.5", {"metrics": 9100}, service_account="not-serving"),
        endpoint("10.0.0.6", {"metrics": 9100}, service_account="not-serving-either"),
        ports=[("http", 80), ("metrics", 9100)],
    )
    known = services.index({}, [reported])[API]

    state = services.cluster(known, known.ports[0], "example.org", version="v3")
    assert state.spiffe_ids == (
        "spiffe://example.org/ns/shop/sa/api",
        "spiffe://example.org/ns/shop/sa/api-canary",
    )
    assert state.ref.mesh_tls
    assert state.version == "v3"
    assert [e.address for e in state.endpoints] == ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]


def test_cluster_endpoints_keep_what_the_provider_said(endpoint: Endpoint, report: Report) -> None:
    reported = report(
        "shop/api",
        endpoint("10.0.0.2", {"http": 8080}, weight=0, locality="eu/west/a"),
        endpoint("10.0.0.1", {"http": 8080}, weight=5, labels=(("version", "v1"),)),
        endpoint("10.0.0.1", {"http": 8080}, weight=5, labels=(("version", "v1"),)),
    )
    known = services.index({}, [reported])[API]

    state = services.cluster(known, known.ports[0], "cluster.local")
    assert state.endpoints == (  # sorted, duplicates once, weight 0 means "not set"
        ClusterEndpoint("10.0.0.1", 8080, 5, provider="vm", labels=(("version", "v1"),)),
        ClusterEndpoint("10.0.0.2", 8080, 1, locality="eu/west/a", provider="vm"),
    )


def test_external_clusters_have_no_mesh_tls_and_no_spiffe_ids(
    endpoint: Endpoint, report: Report
) -> None:
    reported = report(
        "egress/payments",
        endpoint("192.0.2.10", {"https": 443}, service_account="payments"),
        ports=[("https", 443, "HTTPS")],
        location="MESH_EXTERNAL",
        resolution="STATIC",
        hosts=("payments.example.com",),
        subject_alt_names=("payments.example.com",),
    )
    known = services.index({}, [reported])[MeshService("egress", "payments")]

    assert known.external
    state = services.cluster(known, known.ports[0], "cluster.local")
    assert state.ref.mesh_tls is False
    assert state.spiffe_ids == ()
    assert state.ref.subject_alt_names == ("payments.example.com",)
    assert [(e.address, e.port) for e in state.endpoints] == [("192.0.2.10", 443)]


@pytest.mark.parametrize(
    ("resolution", "discovery"),
    [
        ("STATIC", "STATIC"),
        ("DNS", "DNS"),
        ("DNS_ROUND_ROBIN", "LOGICAL_DNS"),
        ("NONE", "PASSTHROUGH"),
        ("SOMETHING-NEW", "STATIC"),
    ],
)
def test_discovery_follows_resolution(report: Report, resolution: str, discovery: str) -> None:
    reported = report("egress/api", resolution=resolution, location="MESH_EXTERNAL")
    known = services.index({}, [reported])[MeshService("egress", "api")]

    assert known.discovery == discovery
    assert services.cluster(known, known.ports[0], "cluster.local").ref.discovery == discovery


def test_reports_of_several_providers_merge_and_the_first_provider_describes(
    docs: Docs, endpoint: Endpoint, report: Report
) -> None:
    k8s = report("shop/api", endpoint("10.0.1.1", {"web": 8080}), provider="k8s")
    vm = report("shop/api", endpoint("10.0.2.1", {"web": 8080}), provider="vm", resolution="DNS")
    known = _known(docs, TWO_PORTS, vm, k8s)

    api = known[API]
    assert api.providers == ("k8s", "vm")
    assert [e.address for e in api.endpoints] == ["10.0.1.1", "10.0.2.1"]
    assert api.discovery == "STATIC"  # k8s, sorted first, describes the service
    assert api.location == "MESH_INTERNAL"
    assert not api.external
    assert list(known) == [API]


def test_a_declared_service_without_reports_has_no_endpoints(docs: Docs) -> None:
    known = _known(docs, TWO_PORTS)[API]

    assert known.declared
    assert known.providers == ()
    assert known.endpoints == ()
    assert (known.location, known.discovery, known.export_to) == ("MESH_INTERNAL", "STATIC", ())
    state = services.cluster(known, known.ports[0], "cluster.local")
    assert state.endpoints == ()
    assert state.spiffe_ids == ()
