"""ServiceEntry and WorkloadEntry from the API server, in the chart's control plane.

A Helm install has no spec directory: endpoints-vm reads ServiceEntries and WorkloadEntries
from the API server (the chart's RBAC grants it get/list/watch on ``networking.istio.io``
serviceentries and workloadentries) and turns them into services with endpoints; the
catalog reads the same objects for the mesh specification and writes their status back.
These tests run the rendered Deployments as processes (``tests.deploy.chartprocs``), create
the objects through the real ``kubernetes`` client as ``kubectl apply`` would, and follow
each one through endpoints-vm to the catalog's services, the view the catalog gives the
consuming identity, and a real Envoy sidecar of that identity: onboarded as an operator
does it (``trellis vm bootstrap`` against the chart's injector), its clusters and endpoints
read from its admin API.

The test API server checks no RBAC: the chart's rules for these reads are checked against
the calls the readers make in ``test_chart_wiring``. One control plane serves the module;
each test has its own namespace, so their objects never meet.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.deploy.chartprocs import ChartControlPlane
from tests.deploy.chartsidecar import Proxy, onboard_sidecar
from tests.deploy.helmchart import render
from trellis_kube.client import api_client
from trellis_testing.apps import AppServer
from trellis_testing.envoy import Envoy
from trellis_testing.kube import KubeApi
from trellis_testing.services import ServiceProcess
from trellis_testing.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("chart-service-entries")]

ISTIO = "networking.istio.io/v1"
SMI_ACCESS = "access.smi-spec.io/v1alpha3"
SMI_SPECS = "specs.smi-spec.io/v1alpha4"
#: The CRDs of a cluster with Istio's and SMI's installed, declared before the control plane
#: starts (a CRD installed later is found only at the readers' next retry, 30 s on).
CRDS = {
    "ServiceEntry": (ISTIO, "serviceentries"),
    "WorkloadEntry": (ISTIO, "workloadentries"),
    "TrafficTarget": (SMI_ACCESS, "traffictargets"),
    "HTTPRouteGroup": (SMI_SPECS, "httproutegroups"),
}
#: The label that puts a namespace in the mesh (the chart's default mesh name).
MONITORED = {"trellis.dev/monitored-by": "trellis"}
#: The longest wait for a change to reach a reader: a bound on polling, not a measure
#: (a change takes about a second here).
SETTLE = 30.0


@dataclass
class Mesh:
    """The chart's control plane, and the operator's ``kubernetes`` clients for it."""

    plane: ChartControlPlane
    core: Any
    custom: Any

    def namespace(self, name: str) -> str:
        self.core.create_namespace({"metadata": {"name": name, "labels": MONITORED}})
        return name

    def _where(self, kind: str) -> tuple[str, str, str]:
        api_version, plural = CRDS[kind]
        group, _, version = api_version.partition("/")
        return group, version, plural

    def create(self, kind: str, namespace: str, name: str, spec: dict[str, Any]) -> None:
        group, version, plural = self._where(kind)
        body = {
            "apiVersion": f"{group}/{version}",
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        self.custom.create_namespaced_custom_object(group, version, namespace, plural, body)

    def patch(self, kind: str, namespace: str, name: str, spec: dict[str, Any]) -> None:
        group, version, plural = self._where(kind)
        self.custom.patch_namespaced_custom_object(
            group, version, namespace, plural, name, {"spec": spec}
        )

    def delete(self, kind: str, namespace: str, name: str) -> None:
        group, version, plural = self._where(kind)
        self.custom.delete_namespaced_custom_object(group, version, namespace, plural, name)

    def accepted(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object's ``Accepted`` condition, as the catalog wrote it (None: not yet)."""
        group, version, plural = self._where(kind)
        found = self.custom.get_namespaced_custom_object(group, version, namespace, plural, name)
        conditions = (found.get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Accepted"), None)

    def _admin(self, component: str, path: str) -> dict[str, Any]:
        process: ServiceProcess = self.plane.process(component)
        answer = process.get(path)  # over TLS, with the chart's admin token
        assert answer.status_code == HTTPStatus.OK, f"{component} {path}: {answer.text}"
        return dict(answer.json())

    def services(self) -> dict[tuple[str, str], dict[str, Any]]:
        """The catalog's services (its ``/v1/services``), by (namespace, name)."""
        listed = self._admin("catalog", "/v1/services")["services"]
        return {(s["namespace"], s["name"]): s for s in listed}

    def provided(self, namespace: str, host: str) -> dict[str, Any] | None:
        """endpoints-vm's service for a ServiceEntry host (None: it has none)."""
        answer = self.plane.process("endpoints-vm").get(f"/v1/services/{namespace}/{host}")
        if answer.status_code == HTTPStatus.NOT_FOUND:
            return None
        assert answer.status_code == HTTPStatus.OK, answer.text
        return dict(answer.json())

    def declarations(self) -> dict[str, Any]:
        """What endpoints-vm reads from the API server, with its parse errors."""
        return dict(self._admin("endpoints-vm", "/v1/documents")["kubernetes"])

    def cluster(self, namespace: str, identity: str, service: str) -> dict[str, Any] | None:
        """The cluster of ``service`` in the view a proxy of ``namespace/identity`` gets."""
        view = self._admin("catalog", f"/v1/views/{namespace}/{identity}")
        return next((c for c in view.get("clusters", []) if c["service"] == service), None)

    def external(self, namespace: str, identity: str) -> list[dict[str, Any]]:
        """The external hosts (MESH_EXTERNAL entries) that proxy's egress routes to."""
        view = self._admin("catalog", f"/v1/views/{namespace}/{identity}")
        return list(view.get("external", []))

    def sidecar(self, namespace: str, service: str, folder: Path) -> Proxy:
        return onboard_sidecar(self.plane, namespace, service, folder)


def hosts(envoy: Envoy, cluster: str) -> list[str]:
    """The hosts of ``cluster`` in the Envoy's ``/clusters`` (``name::host::stat::value``)."""
    found = []
    for line in envoy.get("/clusters").text.splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == cluster and parts[2] == "health_flags":
            found.append(parts[1])
    return sorted(found)


def has_cluster(envoy: Envoy, cluster: str) -> bool:
    return any(line.startswith(cluster + "::") for line in envoy.get("/clusters").text.splitlines())


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    scratch = tmp_path_factory.mktemp("chart-service-entries")
    with KubeApi() as kube:
        for kind, (api_version, plural) in CRDS.items():
            kube.declare(f"{api_version}/{plural}", kind=kind, namespaced=True)
        plane = ChartControlPlane(render(scratch / "helm"), scratch / "plane", kube).start()
        api: Any = api_client(plane.kubeconfig)
        try:
            yield Mesh(plane, client.CoreV1Api(api), client.CustomObjectsApi(api))
        finally:
            api.close()
            plane.stop()


@pytest.fixture
def sidecar(mesh: Mesh, tmp_path: Path) -> Iterator[Callable[[str, str], Proxy]]:
    """Onboards sidecars for one test (``sidecar(namespace, service)``); stops them after."""
    started: list[Proxy] = []

    def onboard(namespace: str, service: str) -> Proxy:
        started.append(mesh.sidecar(namespace, service, tmp_path))
        return started[-1]

    yield onboard
    for proxy in started:
        proxy.envoy.stop()


def until(check: Callable[[], Any], message: str) -> Any:
    """``check``'s first truthy answer, polled; fails naming ``message`` and its last one."""
    return asyncio.run(eventually(check, timeout=SETTLE, interval=0.2, message=message))


def addresses(cluster: dict[str, Any] | None) -> list[tuple[str, int]]:
    if cluster is None:
        return []
    return sorted((e["address"], e["port"]) for e in cluster.get("endpoints", []))


def partner_entry(host: str, address: str, ports: dict[str, int] | None = None) -> dict[str, Any]:
    """A MESH_EXTERNAL, STATIC entry with one HTTP port and one endpoint."""
    endpoint: dict[str, Any] = {"address": address}
    if ports is not None:
        endpoint["ports"] = ports
    return {
        "hosts": [host],
        "location": "MESH_EXTERNAL",
        "resolution": "STATIC",
        "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
        "endpoints": [endpoint],
    }


def test_a_static_external_entry_becomes_a_service_that_a_proxy_reaches(
    mesh: Mesh, sidecar: Callable[[str, str], Proxy], request: pytest.FixtureRequest
) -> None:
    ns = mesh.namespace("partners")
    buyer = sidecar(ns, "buyer")
    assert buyer.get("api.partner.example", "/charge").status_code == HTTPStatus.NOT_FOUND
    partner = AppServer("partner").start()  # the partner's API, outside the mesh
    request.addfinalizer(partner.stop)
    entry = partner_entry("api.partner.example", "127.0.0.1", ports={"http": partner.port})
    mesh.create("ServiceEntry", ns, "partner", entry)

    # endpoints-vm, the owner, made a service of the host, with the entry's endpoint
    provided = until(
        lambda: mesh.provided(ns, "api.partner.example"), "endpoints-vm's service for the entry"
    )
    assert provided["source"] == f"ServiceEntry {ns}/partner"
    assert [(e["address"], e["ports"]) for e in provided["endpoints"]] == [
        ("127.0.0.1", {"http": partner.port})
    ]
    # the catalog lists it, from endpoints-vm
    service = until(lambda: mesh.services().get((ns, "partner")), "the catalog's service")
    assert service["providers"] == ["endpoints-vm"]
    assert service["location"] == "MESH_EXTERNAL"
    assert service["hosts"] == ["api.partner.example"]
    assert service["endpoints"] == 1
    assert [(p["port"], p["protocol"]) for p in service["ports"]] == [(80, "http")]
    # a proxy of the namespace is sent the host, its cluster and that cluster's endpoint
    external = until(lambda: mesh.external(ns, "buyer"), "the host in buyer's view")
    assert [(e["host"], e["port"], e["protocol"]) for e in external] == [
        ("api.partner.example", 80, "http")
    ]
    cluster = mesh.cluster(ns, "buyer", "partner")
    assert cluster is not None
    assert cluster["name"] == external[0]["cluster"]
    assert cluster["discovery"] == "STATIC"
    assert addresses(cluster) == [("127.0.0.1", partner.port)]
    # and buyer's Envoy has that cluster, with that endpoint
    sent = until(lambda: hosts(buyer.envoy, cluster["name"]), "the cluster in buyer's Envoy")
    assert sent == [f"127.0.0.1:{partner.port}"]
    # and the workload's request for the host reaches the partner through it
    answer = until(
        lambda: (
            (got := buyer.get("api.partner.example", "/charge")).status_code == HTTPStatus.OK
            and got
        ),
        "buyer's request to the ServiceEntry host answered",
    )
    assert answer.json()["app"] == "partner"
    assert answer.json()["path"] == "/charge"
    accepted = mesh.accepted("ServiceEntry", ns, "partner")
    assert accepted is not None
    assert (accepted["status"], accepted["reason"]) == ("True", "Accepted")


def test_a_selected_workload_entry_moves_and_a_deleted_entry_leaves(
    mesh: Mesh, sidecar: Callable[[str, str], Proxy]
) -> None:
    ns = mesh.namespace("warehouse")
    buyer = sidecar(ns, "buyer")
    mesh.create(
        "WorkloadEntry", ns, "inventory-vm-1",
        {"address": "10.0.0.5", "labels": {"app": "inventory"}, "serviceAccount": "inventory"},
    )  # fmt: skip
    mesh.create(
        "ServiceEntry", ns, "inventory",
        {
            "hosts": ["inventory.vm.internal"],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}],
            "workloadSelector": {"labels": {"app": "inventory"}},
        },
    )  # fmt: skip
    # buyer may call it (SMI: the mesh is not permissive)
    mesh.create(
        "HTTPRouteGroup", ns, "everything",
        {"matches": [{"name": "all", "pathRegex": ".*", "methods": ["*"]}]},
    )  # fmt: skip
    mesh.create(
        "TrafficTarget", ns, "buyer-to-inventory",
        {
            "destination": {"kind": "ServiceAccount", "name": "inventory", "namespace": ns},
            "sources": [{"kind": "ServiceAccount", "name": "buyer", "namespace": ns}],
            "rules": [{"kind": "HTTPRouteGroup", "name": "everything", "matches": ["all"]}],
        },
    )  # fmt: skip

    reached = until(
        lambda: addresses(mesh.cluster(ns, "buyer", "inventory")), "the WorkloadEntry in a view"
    )
    assert reached == [("10.0.0.5", 8080)]
    cluster = mesh.cluster(ns, "buyer", "inventory")
    assert cluster is not None
    sent_as = cluster["name"]
    assert until(lambda: hosts(buyer.envoy, sent_as), "the cluster in buyer's Envoy") == [
        "10.0.0.5:8080"
    ]
    provided = mesh.provided(ns, "inventory.vm.internal")
    assert provided is not None
    assert [(e["address"], e["workload"]) for e in provided["endpoints"]] == [
        ("10.0.0.5", f"{ns}/inventory-vm-1")
    ]
    service = mesh.services()[(ns, "inventory")]
    assert (service["location"], service["endpoints"]) == ("MESH_INTERNAL", 1)
    assert service["service_account"] == "inventory"  # the WorkloadEntry's, which SMI names
    for kind, name in (("WorkloadEntry", "inventory-vm-1"), ("ServiceEntry", "inventory")):
        accepted = until(functools.partial(mesh.accepted, kind, ns, name), f"{kind}'s status")
        assert accepted["status"] == "True", accepted

    # the VM moves: the endpoint follows, the old address is gone
    mesh.patch("WorkloadEntry", ns, "inventory-vm-1", {"address": "10.0.0.6"})
    moved = until(
        lambda: (found := addresses(mesh.cluster(ns, "buyer", "inventory"))) != reached and found,
        "the moved WorkloadEntry in buyer's view",
    )
    assert moved == [("10.0.0.6", 8080)]
    until(
        lambda: hosts(buyer.envoy, sent_as) == ["10.0.0.6:8080"],
        "the moved endpoint in buyer's Envoy",
    )
    assert mesh.services()[(ns, "inventory")]["endpoints"] == 1

    # the entry is deleted: the catalog drops the service, and the proxy its cluster
    mesh.delete("ServiceEntry", ns, "inventory")
    until(lambda: (ns, "inventory") not in mesh.services(), "the service gone from the catalog")
    until(lambda: mesh.cluster(ns, "buyer", "inventory") is None, "the cluster gone from the view")
    until(lambda: not has_cluster(buyer.envoy, sent_as), "the cluster gone from buyer's Envoy")
    assert mesh.provided(ns, "inventory.vm.internal") is None


def test_a_broken_entry_is_refused_naming_its_field_and_the_good_ones_stay(mesh: Mesh) -> None:
    ns = mesh.namespace("mixed")
    mesh.create("ServiceEntry", ns, "good", partner_entry("good.example", "192.0.2.20"))
    until(lambda: mesh.services().get((ns, "good")), "the good entry's service")
    # an endpoint maps a port name that no port of the entry declares
    broken = partner_entry("broken.example", "192.0.2.21", ports={"grpc": 9000})
    mesh.create("ServiceEntry", ns, "broken", broken)

    field = "spec.endpoints[0].ports.grpc"
    refused = until(lambda: mesh.accepted("ServiceEntry", ns, "broken"), "the broken one's status")
    assert (refused["status"], refused["reason"]) == ("False", "Invalid")
    assert refused["message"] == f"{field}: 'grpc' names no port of this ServiceEntry (http)"
    # endpoints-vm refused it too, saying which object and which field
    errors = until(lambda: mesh.declarations()["errors"], "endpoints-vm's parse error")
    assert len(errors) == 1
    assert f"ServiceEntry/{ns}/broken" in errors[0]
    assert field in errors[0]
    # the good entry stays, and the broken one made nothing
    services = mesh.services()
    assert services[(ns, "good")]["endpoints"] == 1
    assert (ns, "broken") not in services
    assert mesh.provided(ns, "broken.example") is None
    assert addresses(mesh.cluster(ns, "buyer", "good")) == [("192.0.2.20", 80)]

    # fixed, it is accepted and served
    mesh.patch(
        "ServiceEntry", ns, "broken", partner_entry("broken.example", "192.0.2.21", {"http": 9000})
    )
    served = until(lambda: addresses(mesh.cluster(ns, "buyer", "broken")), "the fixed entry served")
    assert served == [("192.0.2.21", 9000)]
    # its status is written back after it is served: waited for, as the refusal's is below
    until(
        lambda: (mesh.accepted("ServiceEntry", ns, "broken") or {}).get("status") == "True",
        "the fixed entry accepted",
    )
    assert mesh.declarations()["errors"] == []

    # a broken edit of a good entry is refused, and its last good version stays in force
    mesh.patch("ServiceEntry", ns, "good", broken)
    until(
        lambda: (mesh.accepted("ServiceEntry", ns, "good") or {}).get("status") == "False",
        "the broken edit refused",
    )
    until(
        lambda: any(f"ServiceEntry/{ns}/good" in e for e in mesh.declarations()["errors"]),
        "endpoints-vm's refusal of the edit",
    )
    assert addresses(mesh.cluster(ns, "buyer", "good")) == [("192.0.2.20", 80)]
    assert mesh.services()[(ns, "good")]["hosts"] == ["good.example"]
