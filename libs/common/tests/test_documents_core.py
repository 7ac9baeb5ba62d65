"""Tests for trellis_common.documents.core: Kubernetes v1 Service and ServiceAccount.

Valid documents are the OSM bookstore demo's manifests and Kubernetes-style variations;
invalid ones check that the error names the field (``spec.ports[1].name``) and says why.
"""

from __future__ import annotations

import pytest
import yaml

from trellis_common.documents import core
from trellis_common.documents.base import Document, DocumentError, KindRegistry, Origin

ORIGIN = Origin("file.yaml", 0)

BOOKSTORE = """
apiVersion: v1
kind: Service
metadata:
  name: bookstore
  namespace: bookstore
  labels:
    app: bookstore
spec:
  ports:
  - port: 14001
    name: bookstore-port
  selector:
    app: bookstore
"""

MULTI_PORT = """
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  sessionAffinity: None
  ipFamilies: [IPv4]
  externalTrafficPolicy: Cluster
  selector:
    app: web
  ports:
  - name: http-web
    port: 80
    targetPort: web
    nodePort: 30080
  - name: grpc
    port: 9090
    targetPort: 19090
    appProtocol: grpc
  - name: metrics
    port: 9102
    protocol: UDP
"""

BOOKBUYER_SA = """
apiVersion: v1
kind: ServiceAccount
metadata:
  name: bookbuyer
  namespace: bookbuyer
automountServiceAccountToken: false
secrets:
- name: bookbuyer-token
"""


@pytest.fixture
def registry() -> KindRegistry:
    registry = KindRegistry()
    core.register(registry)
    return registry


def parse(registry: KindRegistry, text: str) -> Document:
    return registry.parse(yaml.safe_load(text), ORIGIN)


def service(registry: KindRegistry, text: str) -> core.Service:
    resource = parse(registry, text).resource
    assert isinstance(resource, core.Service)
    return resource


def test_registers_the_core_kinds_in_v1(registry: KindRegistry) -> None:
    assert registry.kinds() == {"Service", "ServiceAccount", "Namespace"}
    assert registry.versions("Service") == ["v1"]


def test_bookstore_service(registry: KindRegistry) -> None:
    document = parse(registry, BOOKSTORE)
    assert str(document.key) == "Service bookstore/bookstore"
    svc = document.resource
    assert isinstance(svc, core.Service)
    (port,) = svc.spec.ports
    assert (port.name, port.port, port.target, port.protocol) == (
        "bookstore-port",
        14001,
        14001,
        "TCP",
    )
    assert svc.spec.selector == {"app": "bookstore"}
    assert svc.port_by_name("bookstore-port") is port
    assert svc.port_by_name("other") is None
    assert port.resolved_protocol() == "http"


def test_multi_port_service_ignores_unused_kubernetes_fields(registry: KindRegistry) -> None:
    svc = service(registry, MULTI_PORT)
    assert svc.spec.type == "NodePort"
    assert svc.spec.cluster_ip == "10.96.0.10"
    http, grpc, metrics = svc.spec.ports
    assert (http.target, http.node_port, http.resolved_protocol()) == ("web", 30080, "http")
    assert (grpc.target, grpc.resolved_protocol()) == (19090, "grpc")
    assert (metrics.protocol, metrics.resolved_protocol()) == ("UDP", "udp")
    assert svc.port_by_number(9102, "UDP") is metrics
    assert svc.port_by_number(9102) is None


@pytest.mark.parametrize(
    "spec",
    [
        {"clusterIP": "None", "selector": {"app": "db"}},
        {"type": "ExternalName", "externalName": "db.example.com"},
        {"clusterIP": "", "ports": [{"port": 80}]},
    ],
)
def test_services_kubernetes_accepts(registry: KindRegistry, spec: dict[str, object]) -> None:
    raw = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db"}, "spec": spec}
    assert isinstance(registry.parse(raw, ORIGIN).resource, core.Service)


@pytest.mark.parametrize(
    ("name", "app_protocol", "protocol", "expected"),
    [
        (None, None, "TCP", "http"),  # OSM's default
        ("web", None, "TCP", "http"),
        ("http", None, "TCP", "http"),
        ("http-api", None, "TCP", "http"),
        ("http2-api", None, "TCP", "http2"),
        ("grpc", None, "TCP", "grpc"),
        ("grpc-store", None, "TCP", "grpc"),
        ("tcp-db", None, "TCP", "tcp"),
        ("tcpx", None, "TCP", "http"),  # a prefix is followed by '-'
        ("tcp-db", "http", "TCP", "http"),  # appProtocol wins over the name
        ("web", "HTTP2", "TCP", "http2"),
        ("web", "kubernetes.io/h2c", "TCP", "http2"),
        ("web", "grpc", "TCP", "grpc"),
        ("web", "tcp", "TCP", "tcp"),
        ("web", "kubernetes.io/ws", "TCP", "http"),
        ("http-web", "https", "TCP", "tcp"),  # TLS from the app: opaque to the proxy
        ("web", "mysql", "TCP", "tcp"),
        ("http-dns", None, "UDP", "udp"),
        ("http-x", "http", "SCTP", "sctp"),
    ],
)
def test_resolved_protocol(
    name: str | None, app_protocol: str | None, protocol: str, expected: str
) -> None:
    port = core.ServicePort.model_validate(
        {"name": name, "port": 80, "protocol": protocol, "appProtocol": app_protocol}
    )
    assert port.resolved_protocol() == expected


def _service_yaml(ports: str, extra: str = "", name: str = "web") -> str:
    return f"""
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  selector: {{app: web}}
{extra}
  ports:
{ports}
"""


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        (_service_yaml("  - port: 0"), "spec.ports[0].port", "between 1 and 65535"),
        (_service_yaml("  - port: 70000"), "spec.ports[0].port", "between 1 and 65535"),
        (_service_yaml("  - port: '80'"), "spec.ports[0].port", "valid integer"),
        (_service_yaml("  - {port: 80, targetPort: 0}"), "spec.ports[0].targetPort", "between"),
        (_service_yaml("  - {port: 80, targetPort: Web}"), "spec.ports[0].targetPort", "lower"),
        (_service_yaml("  - {port: 80, targetPort: '8080'}"), "spec.ports[0].targetPort", "letter"),
        (_service_yaml("  - {port: 80, targetPort: a--b}"), "spec.ports[0].targetPort", "'--'"),
        (
            _service_yaml("  - {port: 80, targetPort: averyverylongname}"),
            "spec.ports[0].targetPort",
            "no more than 15",
        ),
        (_service_yaml("  - {port: 80, targetPort: 1.5}"), "spec.ports[0].targetPort", "number"),
        (_service_yaml("  - {port: 80, name: Web_Port}"), "spec.ports[0].name", "lower case"),
        (
            _service_yaml("  - {port: 80}\n  - {port: 81, name: b}"),
            "spec.ports[0].name",
            "required when a Service has several ports",
        ),
        (
            _service_yaml("  - {port: 80, name: a}\n  - {port: 81, name: a}"),
            "spec.ports[1].name",
            "'a' is also the name of ports[0]",
        ),
        (
            _service_yaml("  - {port: 80, name: a}\n  - {port: 80, name: b}"),
            "spec.ports[1].port",
            "80/TCP is also ports[0]",
        ),
        (_service_yaml("  - {port: 80, protocol: HTTP}"), "spec.ports[0].protocol", "'TCP'"),
        (_service_yaml("  - {port: 80, containerPort: 8}"), "spec.ports[0].containerPort", "Extra"),
        (_service_yaml("  - port: 80", "  selecter: {}"), "spec.selecter", "Extra inputs"),
        (_service_yaml("    []"), "spec.ports", "at least one port"),
        (_service_yaml("  - port: 80", "  clusterIP: abc"), "spec.clusterIP", "IP address"),
        (_service_yaml("  - port: 80", "  type: Internal"), "spec.type", "'ClusterIP'"),
        (_service_yaml("  - port: 80", name="1web"), "metadata.name", "start with a letter"),
        (_service_yaml("  - port: 80", name="web.v1"), "metadata.name", "DNS"),
    ],
)
def test_invalid_services(registry: KindRegistry, text: str, field: str, reason: str) -> None:
    with pytest.raises(DocumentError) as caught:
        parse(registry, text)
    assert caught.value.field == field
    assert reason in caught.value.reason


def test_service_account_has_no_spec(registry: KindRegistry) -> None:
    document = parse(registry, BOOKBUYER_SA)
    assert str(document.key) == "ServiceAccount bookbuyer/bookbuyer"
    assert isinstance(document.resource, core.ServiceAccount)
    assert document.resource.spec == core.NoSpec()
    empty = BOOKBUYER_SA + "spec: {}\n"
    assert isinstance(parse(registry, empty).resource, core.ServiceAccount)


def test_service_account_rejects_a_spec(registry: KindRegistry) -> None:
    with pytest.raises(DocumentError) as caught:
        parse(registry, BOOKBUYER_SA + "spec:\n  name: x\n")
    assert caught.value.field == "spec"
    assert "has no spec" in caught.value.reason
