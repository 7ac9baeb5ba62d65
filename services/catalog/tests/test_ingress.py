"""OSM IngressBackend in the catalog: what an inbound port admits from outside the mesh, and
the statuses that say why not (:mod:`trellis_catalog.domain.access.inbound`)."""

from __future__ import annotations

from collections.abc import Callable

from trellis_catalog.domain.access import inbound
from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.index.services import ProvidedEndpoint, ProvidedService
from trellis_catalog.domain.model.views import Identity, IngressRule
from trellis_common.documents.base import Document, DocumentError

Mesh = Callable[..., PolicyBuilder]
Report = Callable[..., ProvidedService]
Endpoint = Callable[..., ProvidedEndpoint]


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
    statuses = inbound.ingress_statuses(builder.spec, builder.services, builder.spec.statuses)
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
    statuses = inbound.ingress_statuses(builder.spec, builder.services, builder.spec.statuses)
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
    statuses = inbound.ingress_statuses(builder.spec, builder.services, builder.spec.statuses)
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
    statuses = inbound.ingress_statuses(builder.spec, builder.services, builder.spec.statuses)
    assert "tls.skipClientCertValidation is not applied" in (
        statuses["IngressBackend shop/httpbin"].reason
    )

    ranged = text.replace(sources, sources + "  - {kind: IPRange, name: 10.0.0.0/8}\n")
    (port,) = mesh(ranged, api).build(Identity("shop", "api"), "api").inbound
    assert port.ingress is not None
    assert port.ingress.skip_client_cert_validation
