"""Gateway API routes on Services, through real Envoy sidecars.

A GRPCRoute on ``shop/hello`` sends calls to grpcio servers behind sidecars (``hello-v1``,
``hello-v2``: ports without ``appProtocol``, so gRPC for a GRPCRoute) by method and header,
with weights, header modifiers, an invalid backend (UNAVAILABLE) and no match
(UNIMPLEMENTED). An HTTPRoute on ``shop/web`` routes HTTP by path, header and weight. The
routes' statuses are in the catalog's ``/v1/resources`` and ``trellis spec list``.

The tests run on one mesh, started once for the module (``shared``): each onboards its own
sidecars, apps and workloads and writes (or rewrites) its own spec documents, all of which
:class:`Baseline` undoes after it.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from trellis_testing import RedisServer, eventually
from trellis_testing.baseline import Baseline, module_mesh
from trellis_testing.grpcapp import GrpcApp, call
from trellis_testing.mesh import Mesh, Sidecar

# one mesh for the module: its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("gateway-routes")]

ONBOARDED = (  # (namespace, service, account) of every sidecar the tests start
    ("shop", "hello-v1", "hello-v1"),
    ("shop", "hello-v2", "hello-v2"),
    ("shop", "web-v1", "web-v1"),
    ("shop", "web-v2", "web-v2"),
    ("shop", "client", "client"),
    ("shop", "web", "web"),
)

SERVICES = """
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: shop}
spec: {ports: [{name: api, port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: hello-v1, namespace: shop}
spec: {ports: [{name: api, port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: hello-v2, namespace: shop}
spec: {ports: [{name: api, port: 9000}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-v1, namespace: shop}
spec: {ports: [{name: http, port: 8080}]}
---
apiVersion: v1
kind: Service
metadata: {name: web-v2, namespace: shop}
spec: {ports: [{name: http, port: 8080}]}
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}}
"""

GRPC_ROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: hello, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: hello, port: 9000}]
  rules:
  - matches:
    - method: {service: helloworld.Greeter, method: SayHello}
      headers: [{name: x-version, value: "2"}]
    backendRefs: [{name: hello-v2, port: 9000}]
  - matches:
    - method: {service: helloworld.Greeter}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-routed-by, value: grpcroute}]}
    backendRefs:
    - {name: hello-v1, port: 9000, weight: 80}
    - {name: hello-v2, port: 9000, weight: 20}
  - matches:
    - method: {type: RegularExpression, service: "broken\\\\..*"}
    backendRefs: [{name: hello-v1, port: 9000, weight: 1}, {name: missing, port: 9000, weight: 1}]
"""

HTTP_ROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{group: "", kind: Service, name: web, port: 8080}]
  rules:
  - matches:
    - path: {type: PathPrefix, value: /v2}
    - headers: [{name: x-canary, value: "yes"}]
    backendRefs: [{name: web-v2, port: 8080}]
  - matches:
    - path: {type: Exact, value: /split}
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {add: [{name: x-split, value: "1"}]}
    backendRefs:
    - {name: web-v1, port: 8080, weight: 50}
    - {name: web-v2, port: 8080, weight: 50}
  - matches:
    - path: {type: PathPrefix, value: /}
    backendRefs: [{name: web-v1, port: 8080}]
"""


class GatewayMesh(Mesh):
    """The services on the module's spec; it keeps the gRPC apps the tests start, so that
    :class:`Baseline` stops any a test left running."""

    def __init__(self, tmp: Path, state_dir: Path, redis: RedisServer, spec_dir: Path) -> None:
        super().__init__(tmp, state_dir, redis, spec_dir)
        self.grpc_apps: list[GrpcApp] = []


class GatewayBaseline(Baseline):
    """The baseline, and the gRPC apps a test left running (its failure came first)."""

    def undo(self) -> None:
        super().undo()
        assert isinstance(self.mesh, GatewayMesh)
        for grpc_app in self.mesh.grpc_apps:
            grpc_app.stop()
        self.mesh.grpc_apps.clear()


shared, mesh = module_mesh(
    "gateway-routes",
    {"services.yaml": SERVICES},
    GatewayMesh,
    lambda mesh: GatewayBaseline(mesh, ONBOARDED),
)


def grpc_backend(mesh: GatewayMesh, name: str) -> tuple[GrpcApp, Sidecar]:
    app = GrpcApp(name).start()
    mesh.grpc_apps.append(app)
    sidecar = mesh.onboard(name, "shop", name, name, app_port=app.port)
    mesh.register(f"{name}-a", name, sidecar.inbound_port, name, "shop", port_name="api")
    return app, sidecar


def status_of(mesh: Mesh, key: str) -> dict[str, Any]:
    listed = mesh.processes["catalog"].get("/v1/resources").json()["resources"]
    found: list[dict[str, Any]] = [s for s in listed if s["key"] == key]
    return found[0] if found else {}


def test_a_grpc_route_routes_by_method_and_header_with_weights(mesh: GatewayMesh) -> None:
    apps = []
    for name in ("hello-v1", "hello-v2"):
        app, sidecar = grpc_backend(mesh, name)
        apps.append(app)
        sidecar.envoy.wait_ready()
    client = mesh.onboard("client", "shop", "client", "client")
    client.envoy.wait_ready()
    (mesh.spec_dir / "grpcroute.yaml").write_text(GRPC_ROUTE)
    channel = grpc.insecure_channel(
        f"127.0.0.1:{client.outbound_port}", options=[("grpc.default_authority", "hello.shop:9000")]
    )
    try:

        def routed() -> bool:
            try:
                reply = call(channel, "/helloworld.Greeter/SayHello", (("x-version", "2"),), 2)
            except grpc.RpcError:
                return False
            return bool(reply["app"] == "hello-v2")

        asyncio.run(eventually(routed, timeout=40, interval=0.3, message="the GRPCRoute routes"))

        # by method and header: always v2
        for _ in range(10):
            assert call(channel, "/helloworld.Greeter/SayHello", (("x-version", "2"),))["app"] == (
                "hello-v2"
            )
        # by service, weighted 80/20, with the rule's header set for the backend
        replies = [call(channel, "/helloworld.Greeter/SayGoodbye") for _ in range(300)]
        shares = Counter(r["app"] for r in replies)
        assert 195 <= shares["hello-v1"] <= 285, shares  # 240 expected; p(outside) < 1e-5
        assert all(r["metadata"]["x-routed-by"] == "grpcroute" for r in replies)
        assert all(r["method"] == "/helloworld.Greeter/SayGoodbye" for r in replies)

        # an invalid backend's share is UNAVAILABLE; the valid one still answers
        codes: Counter[str] = Counter()
        for _ in range(60):
            try:
                codes[call(channel, "/broken.Thing/Do")["app"]] += 1
            except grpc.RpcError as exc:
                codes[exc.code().name] += 1
        assert set(codes) == {"hello-v1", "UNAVAILABLE"}, codes
        assert 12 <= codes["UNAVAILABLE"] <= 48, codes

        # no rule matches: UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as failed:
            call(channel, "/other.Service/Method")
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
        for app in apps:
            app.stop()

    status = status_of(mesh, "GRPCRoute shop/hello")
    [parent] = status["parents"]
    conditions = {c["type"]: c for c in parent["conditions"]}
    assert (conditions["Accepted"]["status"], conditions["Accepted"]["reason"]) == (
        "True",
        "Accepted",
    )
    assert conditions["ResolvedRefs"]["reason"] == "BackendNotFound"
    assert "Service shop/missing not found" in conditions["ResolvedRefs"]["message"]
    listed = mesh.trellis("spec", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "BackendNotFound" in listed.stdout


def test_an_http_route_routes_by_path_header_and_weight(mesh: GatewayMesh) -> None:
    for name in ("web-v1", "web-v2"):
        sidecar = mesh.onboard(name, "shop", name, name, app_port=mesh.app(name).port)
        mesh.register(f"{name}-a", name, sidecar.inbound_port, name, "shop")
        sidecar.envoy.wait_ready()
    client = mesh.onboard("web-client", "shop", "client", "client")
    client.envoy.wait_ready()
    (mesh.spec_dir / "httproute.yaml").write_text(HTTP_ROUTE)
    host = "web.shop:8080"

    def routed() -> bool:
        try:
            return bool(client.get(host, "/v2/items", timeout=2).json()["app"] == "web-v2")
        except (httpx.HTTPError, ValueError, KeyError):
            return False

    asyncio.run(eventually(routed, timeout=40, interval=0.3, message="the HTTPRoute routes"))
    assert client.get(host, "/v2").json()["app"] == "web-v2"
    assert client.get(host, "/v2x").json()["app"] == "web-v1"  # a prefix is whole segments
    canary = httpx.get(
        f"http://127.0.0.1:{client.outbound_port}/anything",
        headers={"host": host, "x-canary": "yes"},
        timeout=5,
    )
    assert canary.json()["app"] == "web-v2"
    assert client.get(host, "/anything").json()["app"] == "web-v1"
    replies = [client.get(host, "/split").json() for _ in range(200)]
    shares = Counter(r["app"] for r in replies)
    assert 65 <= shares["web-v1"] <= 135, shares  # 100 expected
    assert all(r["headers"].get("x-split") == "1" for r in replies)
    assert client.get(host, "/split/more").json()["app"] == "web-v1"  # Exact is exact
    status = status_of(mesh, "HTTPRoute shop/web")
    assert status["state"] == "valid", json.dumps(status)


GRPC_ACCESS = """
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {name: client-greets, namespace: shop}
spec:
  destination: {kind: ServiceAccount, name: hello-v1, namespace: shop}
  sources: [{kind: ServiceAccount, name: client, namespace: shop}]
  rules: [{kind: GRPCRoute, name: hello-access, matches: [greet]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: hello-access, namespace: shop}
spec:
  rules:
  - name: greet
    matches: [{method: {service: helloworld.Greeter, method: SayHello}}]
"""


def test_a_traffic_target_allows_grpc_methods_by_a_grpc_route(mesh: GatewayMesh) -> None:
    """The server's sidecar enforces it (RBAC on the inbound routes), as OSM answers: a
    method no rule allows finds no route (404: UNIMPLEMENTED); a caller the rule does not
    name is refused (403: PERMISSION_DENIED)."""
    services = mesh.spec_dir / "services.yaml"
    declared = services.read_text().split("---\napiVersion: config.openservicemesh")[0]
    # no GRPCRoute sends to hello-v1 here: its port says it speaks gRPC (not permissive)
    declared = declared.replace(
        "metadata: {name: hello-v1, namespace: shop}\nspec: {ports: [{name: api, port: 9000}]}",
        "metadata: {name: hello-v1, namespace: shop}\n"
        "spec: {ports: [{name: api, port: 9000, appProtocol: grpc}]}",
    )
    services.write_text(declared)
    (mesh.spec_dir / "access.yaml").write_text(GRPC_ACCESS)
    app, sidecar = grpc_backend(mesh, "hello-v1")
    client = mesh.onboard("client", "shop", "client", "client")
    stranger = mesh.onboard("stranger", "shop", "web", "web")
    for proxy in (sidecar, client, stranger):
        proxy.envoy.wait_ready()

    def channel_of(proxy: Sidecar) -> grpc.Channel:
        return grpc.insecure_channel(
            f"127.0.0.1:{proxy.outbound_port}",
            options=[("grpc.default_authority", "hello-v1.shop:9000")],
        )

    mine, theirs = channel_of(client), channel_of(stranger)
    try:

        def allowed() -> bool:
            try:
                return bool(call(mine, "/helloworld.Greeter/SayHello", timeout=2)["app"])
            except grpc.RpcError:
                return False

        asyncio.run(eventually(allowed, timeout=40, interval=0.3, message="SayHello allowed"))
        served = app.calls
        with pytest.raises(grpc.RpcError) as unrouted:
            call(mine, "/helloworld.Greeter/SayGoodbye")
        assert unrouted.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.RpcError) as refused:
            call(theirs, "/helloworld.Greeter/SayHello")
        assert refused.value.code() in (
            grpc.StatusCode.PERMISSION_DENIED,  # web may not call hello-v1 at all: its own
            grpc.StatusCode.UNIMPLEMENTED,  # sidecar has no route to it (deny by default)
        )
        assert app.calls == served  # neither reached the application
    finally:
        mine.close()
        theirs.close()
        app.stop()
    status = status_of(mesh, "TrafficTarget shop/client-greets")
    assert status["state"] == "valid", json.dumps(status)
