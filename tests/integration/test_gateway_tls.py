"""Trellis' Gateway at the edge with TLS: an HTTPS listener terminated with a certificate
from files, and a TLS listener passing TLS through (TLSRoute) by server name.

Real processes: the control plane with its injector, ``trellis gateway run`` and its Envoy,
apps behind real sidecars. The HTTPS listener's certificate is a file in the gateway's
certificates folder (``<certs-dir>/<namespace>/<secret>/tls.crt``, ``tls.key``): the gateway
Envoy reads it itself and a client verifying that certificate reaches the HTTP app. Through
the TLS listener, the client's TLS reaches the app's own TLS server untouched: the client
verifies the app's certificate, which the gateway never has, and the bytes cross the mesh
inside mTLS like a TCP service's.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.gatewayrun import GatewayRun, spec_mesh
from trellis_proxy_cp.testing.gateway import write_certificate
from trellis_testing import RedisServer
from trellis_testing.mesh import Mesh
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def spec(https_port: int, tls_port: int) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {{name: trellis}}
spec: {{controllerName: trellis.dev/gateway}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {{name: edge, namespace: shop}}
spec:
  gatewayClassName: trellis
  listeners:
  - name: https
    port: {https_port}
    protocol: HTTPS
    hostname: web.example.com
    tls: {{certificateRefs: [{{name: web-tls}}]}}
  - name: tls
    port: {tls_port}
    protocol: TLS
    hostname: "*.example.com"
    tls: {{mode: Passthrough}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: web, namespace: shop}}
spec:
  parentRefs: [{{name: edge, sectionName: https}}]
  rules: [{{backendRefs: [{{name: web, port: 8080}}]}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {{name: vault, namespace: shop}}
spec:
  parentRefs: [{{name: edge, sectionName: tls}}]
  hostnames: [vault.example.com]
  rules: [{{backendRefs: [{{name: vault, port: 8200}}]}}]
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec: {{ports: [{{name: http, port: 8080}}]}}
---
apiVersion: v1
kind: Service
metadata: {{name: vault, namespace: shop}}
spec: {{ports: [{{name: https, port: 8200}}]}}
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {{name: everything, namespace: shop}}
spec: {{matches: [{{name: all, pathRegex: ".*"}}]}}
---
apiVersion: specs.smi-spec.io/v1alpha4
kind: TCPRoute
metadata: {{name: any-port, namespace: shop}}
spec: {{}}
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {{name: edge-to-web, namespace: shop}}
spec:
  destination: {{kind: ServiceAccount, name: web, namespace: shop}}
  sources: [{{kind: ServiceAccount, name: edge, namespace: shop}}]
  rules: [{{kind: HTTPRouteGroup, name: everything, matches: [all]}}]
---
apiVersion: access.smi-spec.io/v1alpha3
kind: TrafficTarget
metadata: {{name: edge-to-vault, namespace: shop}}
spec:
  destination: {{kind: ServiceAccount, name: vault, namespace: shop}}
  sources: [{{kind: ServiceAccount, name: edge, namespace: shop}}]
  rules: [{{kind: TCPRoute, name: any-port}}]
"""


class _Vault(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"app": "vault", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class TlsApp:
    """An HTTPS application with its own certificate (the gateway never holds it)."""

    def __init__(self, folder: Path, host: str) -> None:
        self.certificate = folder / "tls.crt"
        write_certificate(folder, host)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Vault)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def https_get(port: int, host: str, ca: Path, path: str = "/") -> dict[str, Any] | None:
    """GET ``path`` over TLS to 127.0.0.1:``port`` with ``host`` as the server name,
    verifying the server against ``ca``; the JSON answer (None: no answer yet)."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=host) as tls,
        ):
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            tls.sendall(request.encode())
            answer = b""
            while chunk := tls.recv(65536):
                answer += chunk
    except (OSError, ssl.SSLError):
        return None
    head, _, body = answer.partition(b"\r\n\r\n")
    if head.split(b" ", 2)[1:2] != [b"200"]:
        return None
    found: dict[str, Any] = json.loads(body)
    return found


@pytest.fixture
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture
def mesh(
    tmp_path: Path, state_dir: Path, redis_server: RedisServer, ports: tuple[int, int]
) -> Iterator[Mesh]:
    with spec_mesh(tmp_path, state_dir, redis_server, spec(*ports)) as mesh:
        yield mesh


@pytest.fixture
def vault(mesh: Mesh, tmp_path: Path) -> Iterator[TlsApp]:
    """The apps behind their sidecars: ``web`` (HTTP) and ``vault`` (its own TLS)."""
    web = mesh.app("web")
    web_sidecar = mesh.onboard("web", "shop", "web", "web", app_port=web.port)
    mesh.register("web-a", "web", web_sidecar.inbound_port, "web", "shop")
    app = TlsApp(tmp_path / "vault-cert", "vault.example.com")
    try:
        sidecar = mesh.onboard("vault", "shop", "vault", "vault", app_port=app.port)
        mesh.register("vault-a", "vault", sidecar.inbound_port, "vault", "shop", port_name="https")
        web_sidecar.envoy.wait_ready()
        sidecar.envoy.wait_ready()
        yield app
    finally:
        app.stop()


async def test_https_is_terminated_and_tls_passed_through_at_the_gateway(
    mesh: Mesh, vault: TlsApp, ports: tuple[int, int], tmp_path: Path
) -> None:
    https_port, tls_port = ports
    # the HTTPS listener's certificate, where the gateway's Envoy reads it (a Secret volume's
    # layout): written by the operator, never sent to the control plane
    out = tmp_path / "gateway"
    gateway_ca = write_certificate(out / "certs" / "shop" / "web-tls", "web.example.com")
    (tmp_path / "gateway-ca.pem").write_bytes(gateway_ca)
    gateway = GatewayRun(mesh, out, free_port(), "shop", "edge")
    try:

        def terminated() -> dict[str, Any] | None:
            assert gateway.process.poll() is None, gateway.output()
            return https_get(https_port, "web.example.com", tmp_path / "gateway-ca.pem", "/a")

        await eventually(terminated, timeout=90, interval=0.5, message="HTTPS served")
        answer = terminated()
        assert answer is not None
        assert (answer["app"], answer["path"]) == ("web", "/a")

        def passed() -> dict[str, Any] | None:
            return https_get(tls_port, "vault.example.com", vault.certificate, "/v1/secret")

        # the client verifies the app's own certificate: the gateway did not terminate
        answer = await eventually(passed, timeout=60, interval=0.5, message="TLS passed through")
        assert answer == {"app": "vault", "path": "/v1/secret"}
        # a server name no TLSRoute has is refused; the HTTPS listener's name is its own
        assert https_get(tls_port, "other.example.com", vault.certificate) is None
        assert https_get(https_port, "web.example.com", vault.certificate) is None  # not vault's
    finally:
        gateway.stop()

    resources = mesh.processes["catalog"].get("/v1/resources").json()["resources"]
    listed = {s["key"]: s for s in resources}
    [parent] = listed["TLSRoute shop/vault"]["parents"]
    assert {c["type"]: c["status"] for c in parent["conditions"]} == {
        "Accepted": "True",
        "ResolvedRefs": "True",
    }
    attached = {
        item["name"]: item["attached_routes"] for item in listed["Gateway shop/edge"]["listeners"]
    }
    assert attached == {"https": 1, "tls": 1}
