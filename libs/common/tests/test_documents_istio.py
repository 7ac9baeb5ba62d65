"""Tests for trellis_common.documents.istio: ServiceEntry and WorkloadEntry documents.

The valid documents are the examples of Istio's ``service_entry.proto`` comments, as YAML;
invalid ones check that the error names the field (``spec.ports[1].number``) and says why.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from trellis_common.documents import istio
from trellis_common.documents.base import Document, DocumentError, KindRegistry, Origin

ORIGIN = Origin("file.yaml", 0)


@pytest.fixture
def registry() -> KindRegistry:
    registry = KindRegistry()
    istio.register(registry)
    return registry


def parse(registry: KindRegistry, raw: object) -> Document:
    if isinstance(raw, str):
        raw = yaml.safe_load(raw)
    return registry.parse(raw, ORIGIN)


def service_entry_spec(document: Document) -> istio.ServiceEntrySpec:
    assert isinstance(document.resource, istio.ServiceEntry)
    return document.resource.spec


# --- the seed's examples ---------------------------------------------------------------------

EXTERNAL_HTTPS = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-svc-https
spec:
  hosts:
  - api.dropboxapi.com
  - www.googleapis.com
  - api.facebook.com
  location: MESH_EXTERNAL
  ports:
  - number: 443
    name: https
    protocol: TLS
  resolution: DNS
"""

MONGO_CLUSTER = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-svc-mongocluster
spec:
  hosts:
  - mymongodb.somedomain # not used
  addresses:
  - 192.192.192.192/24 # VIPs
  ports:
  - number: 27018
    name: mongodb
    protocol: MONGO
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints:
  - address: 2.2.2.2
  - address: 3.3.3.3
"""

WIKIPEDIA_REDIRECT = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-svc-redirect
spec:
  hosts:
  - wikipedia.org
  - "*.wikipedia.org"
  location: MESH_EXTERNAL
  ports:
  - number: 443
    name: https
    protocol: TLS
  resolution: NONE
"""

HTTPBIN_EXPORT = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-svc-httpbin
  namespace : egress
spec:
  hosts:
  - httpbin.com
  exportTo:
  - "."
  location: MESH_EXTERNAL
  ports:
  - number: 80
    name: http
    protocol: HTTP
  resolution: DNS
"""

WILDCARD = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-svc-wildcard-example
spec:
  hosts:
  - "*.bar.com"
  location: MESH_EXTERNAL
  ports:
  - number: 80
    name: http
    protocol: HTTP
  resolution: NONE
"""

UNIX_SOCKET = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: unix-domain-socket-example
spec:
  hosts:
  - "example.unix.local"
  location: MESH_EXTERNAL
  ports:
  - number: 80
    name: http
    protocol: HTTP
  resolution: STATIC
  endpoints:
  - address: unix:///var/run/example/socket
"""

# The seed maps the endpoints' ports under "https", a name the entry does not declare (its
# port is "http"); Istio's validation refuses that, and later Istio docs say "http". See
# test_seed_dns_example_as_written_names_an_undeclared_port.
EXTERNAL_DNS = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-svc-dns
spec:
  hosts:
  - foo.bar.com
  location: MESH_EXTERNAL
  ports:
  - number: 80
    name: http
    protocol: HTTP
  resolution: DNS
  endpoints:
  - address: us.foo.bar.com
    ports:
      http: 8080
  - address: uk.foo.bar.com
    ports:
      http: 9080
  - address: in.foo.bar.com
    ports:
      http: 7080
"""

SUBJECT_ALT_NAMES = """
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: httpbin
  namespace : httpbin-ns
spec:
  hosts:
  - httpbin.com
  location: MESH_INTERNAL
  ports:
  - number: 80
    name: http
    protocol: HTTP
  resolution: STATIC
  endpoints:
  - address: 2.2.2.2
  - address: 3.3.3.3
  subjectAltNames:
  - "spiffe://cluster.local/ns/httpbin-ns/sa/httpbin-service-account"
"""

# From Istio's documentation of workloadSelector (not in the seed, which predates it).
WORKLOAD_SELECTOR = """
apiVersion: networking.istio.io/v1beta1
kind: ServiceEntry
metadata:
  name: details-svc
  namespace: bookinfo
spec:
  hosts:
  - details.bookinfo.com
  location: MESH_INTERNAL
  ports:
  - number: 80
    name: http
    protocol: HTTP
    targetPort: 8080
  resolution: STATIC
  workloadSelector:
    labels:
      app: details-legacy
"""

DETAILS_WORKLOAD = """
apiVersion: networking.istio.io/v1beta1
kind: WorkloadEntry
metadata:
  name: details-svc
  namespace: bookinfo
spec:
  serviceAccount: details-legacy
  address: 2.2.2.2
  labels:
    app: details-legacy
    instance-id: vm1
  network: vm-network
  locality: us/us-east-1/az-1/r11
  weight: 3
  ports:
    http: 9080
"""


@pytest.mark.parametrize(
    ("text", "name", "hosts", "location", "resolution", "endpoints"),
    [
        (
            EXTERNAL_HTTPS,
            "external-svc-https",
            ("api.dropboxapi.com", "www.googleapis.com", "api.facebook.com"),
            istio.Location.MESH_EXTERNAL,
            istio.Resolution.DNS,
            (),
        ),
        (
            MONGO_CLUSTER,
            "external-svc-mongocluster",
            ("mymongodb.somedomain",),
            istio.Location.MESH_INTERNAL,
            istio.Resolution.STATIC,
            ("2.2.2.2", "3.3.3.3"),
        ),
        (
            WIKIPEDIA_REDIRECT,
            "external-svc-redirect",
            ("wikipedia.org", "*.wikipedia.org"),
            istio.Location.MESH_EXTERNAL,
            istio.Resolution.NONE,
            (),
        ),
        (
            HTTPBIN_EXPORT,
            "external-svc-httpbin",
            ("httpbin.com",),
            istio.Location.MESH_EXTERNAL,
            istio.Resolution.DNS,
            (),
        ),
        (
            WILDCARD,
            "external-svc-wildcard-example",
            ("*.bar.com",),
            istio.Location.MESH_EXTERNAL,
            istio.Resolution.NONE,
            (),
        ),
        (
            UNIX_SOCKET,
            "unix-domain-socket-example",
            ("example.unix.local",),
            istio.Location.MESH_EXTERNAL,
            istio.Resolution.STATIC,
            ("unix:///var/run/example/socket",),
        ),
        (
            EXTERNAL_DNS,
            "external-svc-dns",
            ("foo.bar.com",),
            istio.Location.MESH_EXTERNAL,
            istio.Resolution.DNS,
            ("us.foo.bar.com", "uk.foo.bar.com", "in.foo.bar.com"),
        ),
        (
            SUBJECT_ALT_NAMES,
            "httpbin",
            ("httpbin.com",),
            istio.Location.MESH_INTERNAL,
            istio.Resolution.STATIC,
            ("2.2.2.2", "3.3.3.3"),
        ),
        (
            WORKLOAD_SELECTOR,
            "details-svc",
            ("details.bookinfo.com",),
            istio.Location.MESH_INTERNAL,
            istio.Resolution.STATIC,
            (),
        ),
    ],
)
def test_seed_examples_parse(
    registry: KindRegistry,
    text: str,
    name: str,
    hosts: tuple[str, ...],
    location: istio.Location,
    resolution: istio.Resolution,
    endpoints: tuple[str, ...],
) -> None:
    document = parse(registry, text)
    assert document.key.kind == "ServiceEntry"
    assert document.key.name == name
    spec = service_entry_spec(document)
    assert spec.hosts == hosts
    assert spec.location is location
    assert spec.resolution is resolution
    assert tuple(endpoint.address for endpoint in spec.endpoints) == endpoints


def test_seed_examples_keep_their_details(registry: KindRegistry) -> None:
    mongo = service_entry_spec(parse(registry, MONGO_CLUSTER))
    assert mongo.addresses == ("192.192.192.192/24",)
    assert mongo.ports == (
        istio.ServicePort(number=27018, protocol=istio.PortProtocol.MONGO, name="mongodb"),
    )

    httpbin = parse(registry, HTTPBIN_EXPORT)
    assert httpbin.key.namespace == "egress"
    assert service_entry_spec(httpbin).export_to == (".",)

    sans = service_entry_spec(parse(registry, SUBJECT_ALT_NAMES))
    assert sans.subject_alt_names == (
        "spiffe://cluster.local/ns/httpbin-ns/sa/httpbin-service-account",
    )

    selector = service_entry_spec(parse(registry, WORKLOAD_SELECTOR))
    assert selector.workload_selector == istio.WorkloadSelector(labels={"app": "details-legacy"})
    assert selector.ports[0].target_port == 8080

    dns = service_entry_spec(parse(registry, EXTERNAL_DNS))
    assert [endpoint.port_for("http") for endpoint in dns.endpoints] == [8080, 9080, 7080]


def test_workload_entry_parses(registry: KindRegistry) -> None:
    document = parse(registry, DETAILS_WORKLOAD)
    assert document.key.kind == "WorkloadEntry"
    assert isinstance(document.resource, istio.WorkloadEntry)
    spec = document.resource.spec
    assert spec.address == "2.2.2.2"
    assert spec.service_account == "details-legacy"
    assert spec.labels == {"app": "details-legacy", "instance-id": "vm1"}
    assert spec.network == "vm-network"
    assert spec.weight == 3
    assert spec.port_for("http") == 9080
    assert spec.port_for("grpc") is None
    # Istio splits a locality in three: deeper parts stay in the subzone.
    assert spec.locality_parts() == ("us", "us-east-1", "az-1/r11")


def test_seed_dns_example_as_written_names_an_undeclared_port(registry: KindRegistry) -> None:
    raw = yaml.safe_load(EXTERNAL_DNS.replace("http: ", "https: "))
    with pytest.raises(DocumentError) as caught:
        parse(registry, raw)
    assert caught.value.field == "spec.endpoints[0].ports.https"
    assert "'https' names no port of this ServiceEntry (http)" in caught.value.reason


# --- versions, registration, defaults --------------------------------------------------------


@pytest.mark.parametrize("version", ["v1alpha3", "v1beta1", "v1"])
@pytest.mark.parametrize("text", [WIKIPEDIA_REDIRECT, DETAILS_WORKLOAD])
def test_every_api_version_parses(registry: KindRegistry, version: str, text: str) -> None:
    raw = yaml.safe_load(text)
    raw["apiVersion"] = f"networking.istio.io/{version}"
    document = parse(registry, raw)
    assert document.api_version == f"networking.istio.io/{version}"


def test_register_adds_both_kinds_in_three_versions(registry: KindRegistry) -> None:
    assert registry.kinds() == {"ServiceEntry", "WorkloadEntry"}
    assert registry.versions("ServiceEntry") == sorted(istio.API_VERSIONS)
    assert registry.versions("WorkloadEntry") == sorted(istio.API_VERSIONS)


def test_unknown_api_version_lists_the_known_ones(registry: KindRegistry) -> None:
    raw = yaml.safe_load(WILDCARD)
    raw["apiVersion"] = "networking.istio.io/v2"
    with pytest.raises(DocumentError) as caught:
        parse(registry, raw)
    assert caught.value.field == "apiVersion"
    assert "networking.istio.io/v1beta1" in caught.value.reason


def test_defaults_and_normalisation(registry: KindRegistry) -> None:
    spec = service_entry_spec(
        parse(
            registry,
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "ServiceEntry",
                "metadata": {"name": "api"},
                "spec": {
                    "hosts": ["API.Example.COM"],
                    "addresses": ["2001:DB8::1", "2001:db8:0::/64"],
                    "ports": [
                        {"number": 443, "name": "https", "protocol": "https"},
                        {"number": 8080, "name": "alt"},
                    ],
                },
            },
        )
    )
    assert spec.location is istio.Location.MESH_EXTERNAL
    assert spec.resolution is istio.Resolution.NONE
    assert spec.hosts == ("api.example.com",)
    assert spec.addresses == ("2001:db8::1", "2001:db8::/64")
    assert spec.ports[0].protocol is istio.PortProtocol.HTTPS
    assert spec.ports[1].protocol is None
    assert spec.endpoints == ()
    assert spec.workload_selector is None
    assert spec.export_to == ()
    assert spec.subject_alt_names == ()


# --- invalid documents ---------------------------------------------------------------------

BASE_SPEC: dict[str, Any] = {
    "hosts": ["api.example.com"],
    "location": "MESH_INTERNAL",
    "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
    "resolution": "STATIC",
    "endpoints": [{"address": "10.0.0.1"}],
}


def service_entry(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return {
        "apiVersion": "networking.istio.io/v1beta1",
        "kind": "ServiceEntry",
        "metadata": {"name": "api", "namespace": "shop"},
        "spec": spec,
    }


def endpoint(address: str, **fields: Any) -> dict[str, Any]:
    return {"address": address, **fields}


HTTP = {"number": 80, "name": "http", "protocol": "HTTP"}
TCP = {"number": 5432, "name": "db", "protocol": "TCP"}


@pytest.mark.parametrize(
    ("changes", "field", "reason"),
    [
        # hosts
        ({"hosts": None}, "spec.hosts", "Field required"),
        ({"hosts": []}, "spec.hosts", "must list at least one"),
        ({"hosts": ["a.example.com", "*"]}, "spec.hosts[1]", "'*' alone is not allowed"),
        ({"hosts": ["*"], "location": "MESH_EXTERNAL"}, "spec.hosts[0]", "'*' alone"),
        ({"hosts": ["10.0.0.1"]}, "spec.hosts[0]", "is an IP address"),
        ({"hosts": ["::1"]}, "spec.hosts[0]", "is an IP address"),
        ({"hosts": ["foo.*.com"]}, "spec.hosts[0]", "wildcard may only be the whole first"),
        ({"hosts": ["*foo.com"]}, "spec.hosts[0]", "wildcard may only be the whole first"),
        ({"hosts": ["under_score.com"]}, "spec.hosts[0]", "is not a DNS-1123 subdomain"),
        ({"hosts": [80]}, "spec.hosts[0]", "Input should be a valid string"),
        (
            {"hosts": ["*.example.com"], "resolution": "DNS", "endpoints": None},
            "spec.hosts[0]",
            "is a wildcard: with resolution DNS and no endpoints",
        ),
        (
            {"hosts": ["a.example.com", "b.example.com"], "ports": [HTTP, TCP]},
            "spec.hosts",
            "several hosts need ports whose protocol names the host",
        ),
        # addresses
        ({"addresses": ["10.0.0.300"]}, "spec.addresses[0]", "is not an IP address or CIDR"),
        ({"addresses": ["10.0.0.0/33"]}, "spec.addresses[0]", "is not an IP address or CIDR"),
        ({"addresses": ["unix:///tmp/s"]}, "spec.addresses[0]", "Unix domain sockets"),
        (
            {"addresses": ["10.0.0.1", "10.1.0.0/16"], "resolution": "DNS"},
            "spec.addresses[1]",
            "CIDR prefixes need resolution NONE or STATIC",
        ),
        # ports
        ({"ports": None}, "spec.ports", "Field required"),
        ({"ports": []}, "spec.ports", "must list at least one"),
        (
            {"ports": [HTTP, {"number": 80, "name": "web"}]},
            "spec.ports[1].number",
            "port 80 is already declared by ports[0]",
        ),
        (
            {"ports": [HTTP, {"number": 81, "name": "http"}]},
            "spec.ports[1].name",
            "port name 'http' is already used by ports[0]",
        ),
        ({"ports": [{"number": 0, "name": "x"}]}, "spec.ports[0].number", "between 1 and 65535"),
        ({"ports": [{"number": 65536, "name": "x"}]}, "spec.ports[0].number", "got 65536"),
        ({"ports": [{"number": "80", "name": "x"}]}, "spec.ports[0].number", "valid integer"),
        ({"ports": [{"number": 80}]}, "spec.ports[0].name", "Field required"),
        ({"ports": [{"number": 80, "name": "Web"}]}, "spec.ports[0].name", "DNS-1123 label"),
        (
            {"ports": [{"number": 53, "name": "dns", "protocol": "UDP"}]},
            "spec.ports[0].protocol",
            "must be one of HTTP, HTTPS, GRPC, HTTP2, MONGO, TCP, TLS, got 'UDP'",
        ),
        (
            {"ports": [{"number": 80, "name": "x", "targetPort": 70000}]},
            "spec.ports[0].targetPort",
            "between 1 and 65535",
        ),
        # location and resolution
        ({"location": "MESH_OUTSIDE"}, "spec.location", "'MESH_EXTERNAL' or 'MESH_INTERNAL'"),
        ({"resolution": "DYNAMIC"}, "spec.resolution", "'DNS_ROUND_ROBIN'"),
        (
            {"resolution": "NONE"},
            "spec.endpoints",
            "must be empty with resolution NONE",
        ),
        (
            {"endpoints": [endpoint("db.example.com")]},
            "spec.endpoints[0].address",
            "resolution STATIC needs IP addresses",
        ),
        (
            {"resolution": "DNS", "endpoints": [endpoint("unix:///var/run/s.sock")]},
            "spec.endpoints[0].address",
            "a unix:// socket needs resolution STATIC",
        ),
        (
            {"resolution": "DNS_ROUND_ROBIN", "endpoints": [endpoint("a.com"), endpoint("b.com")]},
            "spec.endpoints",
            "DNS_ROUND_ROBIN uses one endpoint",
        ),
        # endpoints
        ({"endpoints": [{}]}, "spec.endpoints[0].address", "Field required"),
        ({"endpoints": [endpoint("")]}, "spec.endpoints[0].address", "is not an IP address"),
        (
            {"resolution": "DNS", "endpoints": [endpoint("*.example.com")]},
            "spec.endpoints[0].address",
            "must be fully qualified, not a wildcard",
        ),
        (
            {"endpoints": [endpoint("unix://relative/socket")]},
            "spec.endpoints[0].address",
            "unix:///absolute/path/to/socket",
        ),
        (
            {"endpoints": [endpoint("unix:///s", ports={"http": 80})]},
            "spec.endpoints[0].ports",
            "must be empty for a unix:// endpoint",
        ),
        (
            {"ports": [HTTP, TCP], "endpoints": [endpoint("unix:///s")]},
            "spec.ports",
            "must list exactly one port for unix:// endpoints, got 2",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", ports={"grpc": 9090})]},
            "spec.endpoints[0].ports.grpc",
            "'grpc' names no port of this ServiceEntry (http)",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", ports={"Web": 80})]},
            "spec.endpoints[0].ports.Web.[key]",
            "'Web' is not a DNS-1123 label",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", ports={"http": 0})]},
            "spec.endpoints[0].ports.http",
            "between 1 and 65535",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", weight=-1)]},
            "spec.endpoints[0].weight",
            "between 0 and 4294967295, got -1",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", locality="us-east-1//az-1")]},
            "spec.endpoints[0].locality",
            "must be region/zone/subzone, with no empty part",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", serviceAccount="Bad_SA")]},
            "spec.endpoints[0].serviceAccount",
            "'Bad_SA' is not a DNS-1123 subdomain",
        ),
        (
            {"endpoints": [endpoint("10.0.0.1", adress="10.0.0.2")]},
            "spec.endpoints[0].adress",
            "Extra inputs are not permitted",
        ),
        # workloadSelector
        (
            {"workloadSelector": {"labels": {"app": "vm"}}},
            "spec.workloadSelector",
            "cannot be used with endpoints",
        ),
        (
            {"endpoints": None, "workloadSelector": {"labels": {"app": "*"}}},
            "spec.workloadSelector.labels",
            "wildcards are not allowed in labels",
        ),
        # exportTo
        (
            {"exportTo": ["Shop"]},
            "spec.exportTo[0]",
            "'Shop' is not '.', '*', '~' or a namespace name",
        ),
        ({"exportTo": ["shop", "shop"]}, "spec.exportTo", "lists a namespace twice"),
        ({"exportTo": [".", "*"]}, "spec.exportTo", "'*' must be the only entry"),
        ({"exportTo": ["~", "shop"]}, "spec.exportTo", "'~' must be the only entry"),
        # subjectAltNames
        ({"subjectAltNames": [""]}, "spec.subjectAltNames[0]", "at least 1 character"),
        ({"subjectAltNames": "spiffe://x"}, "spec.subjectAltNames", "valid tuple"),
        # unknown fields
        ({"port": [HTTP]}, "spec.port", "Extra inputs are not permitted"),
    ],
)
def test_invalid_service_entries(
    registry: KindRegistry, changes: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(DocumentError) as caught:
        parse(registry, service_entry(**changes))
    assert caught.value.field == field
    assert reason in caught.value.reason
    assert caught.value.key is not None
    assert str(caught.value.key) == "ServiceEntry shop/api"


def test_every_problem_is_counted(registry: KindRegistry) -> None:
    changes = {"resolution": "NONE", "workloadSelector": {"labels": {"app": "vm"}}}
    with pytest.raises(DocumentError) as caught:
        parse(registry, service_entry(**changes))
    assert caught.value.field == "spec.workloadSelector"
    assert caught.value.reason.endswith("(and 1 more)")


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({}, "spec.address", "Field required"),
        ({"address": "*.example.com"}, "spec.address", "not a wildcard"),
        ({"address": "10.0.0.1", "ports": {"http": 65536}}, "spec.ports.http", "got 65536"),
        ({"address": "10.0.0.1", "ports": {"http": True}}, "spec.ports.http", "valid integer"),
        ({"address": "10.0.0.1", "weight": -5}, "spec.weight", "between 0 and"),
        ({"address": "10.0.0.1", "labels": ["app"]}, "spec.labels", "valid dictionary"),
        ({"address": "10.0.0.1", "locality": "/zone"}, "spec.locality", "no empty part"),
        ({"address": "10.0.0.1", "selector": {}}, "spec.selector", "Extra inputs"),
    ],
)
def test_invalid_workload_entries(
    registry: KindRegistry, spec: dict[str, Any], field: str, reason: str
) -> None:
    raw = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "WorkloadEntry",
        "metadata": {"name": "vm-1"},
        "spec": spec,
    }
    with pytest.raises(DocumentError) as caught:
        parse(registry, raw)
    assert caught.value.field == field
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("10.0.0.1", "10.0.0.1"),
        ("2001:DB8::0:1", "2001:db8::1"),
        ("VM-1.Example.com", "vm-1.example.com"),
        ("unix:///var/run/app.sock", "unix:///var/run/app.sock"),
    ],
)
def test_workload_entry_addresses(registry: KindRegistry, address: str, expected: str) -> None:
    raw = yaml.safe_load(DETAILS_WORKLOAD)
    raw["spec"]["address"] = address
    resource = parse(registry, raw).resource
    assert isinstance(resource, istio.WorkloadEntry)
    assert resource.spec.address == expected
    assert resource.spec.is_unix == address.startswith("unix://")


# --- helpers for the endpoints provider ------------------------------------------------------


@pytest.mark.parametrize(
    ("export_to", "consumer", "exported"),
    [
        ([], "shop", True),
        ([], "other", True),
        (["."], "shop", True),
        (["."], "other", False),
        (["*"], "other", True),
        (["~"], "shop", False),
        (["~"], "other", False),
        (["billing"], "billing", True),
        (["billing"], "shop", False),
        ([".", "billing"], "shop", True),
        ([".", "billing"], "billing", True),
        ([".", "billing"], "other", False),
    ],
)
def test_exported_to(
    registry: KindRegistry, export_to: list[str], consumer: str, exported: bool
) -> None:
    spec = service_entry_spec(parse(registry, service_entry(exportTo=export_to)))
    assert spec.exported_to("shop", consumer) is exported


def test_port_helpers(registry: KindRegistry) -> None:
    ports = [HTTP, {"number": 443, "name": "https", "protocol": "TLS", "targetPort": 8443}]
    spec = service_entry_spec(parse(registry, service_entry(ports=ports)))
    https = spec.port_by_name("https")
    assert https is not None
    assert (https.number, https.target_port, https.endpoint_port) == (443, 8443, 8443)
    http = spec.port_by_name("http")
    assert http is not None
    assert http.endpoint_port == 80
    assert spec.port_by_name("grpc") is None


@pytest.mark.parametrize(
    ("host", "wildcard"),
    [("*.example.com", True), ("example.com", False), ("a.example.com", False)],
)
def test_is_wildcard_host(host: str, wildcard: bool) -> None:
    assert istio.ServiceEntrySpec.is_wildcard_host(host) is wildcard
