"""A proxyless gRPC client (grpcio's own xDS client, no sidecar) in the mesh.

``trellis grpc bootstrap`` onboards the client; its process dials ``xds:///hello.shop:9000``
with xDS credentials. The GRPCRoute's rules apply as they do for a sidecar: weights (80/20
between ``hello-v1``, behind an Envoy sidecar, and ``hello-v2``, a plain grpcio server that
serves mTLS with its own ``trellis grpc bootstrap`` files), a header match, and a live change
of the route, which the open channel follows.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from trellis_api import certmanager_pb2 as cm
from trellis_common.grpc_bootstrap import GrpcFolder
from trellis_testing import RedisServer, eventually
from trellis_testing.grpcapp import GrpcApp
from trellis_testing.mesh import Mesh

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpc"


SERVICES = (
    (EXAMPLE / "services.yaml").read_text()
    + """
---
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}}
"""
)


def grpc_route(v1: int, v2: int) -> str:
    return f"""
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {{name: hello, namespace: shop}}
spec:
  parentRefs: [{{group: "", kind: Service, name: hello, port: 9000}}]
  rules:
  - matches:
    - method: {{service: helloworld.Greeter}}
      headers: [{{name: x-version, value: "2"}}]
    backendRefs: [{{name: hello-v2, port: 9000}}]
  - matches:
    - method: {{service: helloworld.Greeter}}
    backendRefs:
    - {{name: hello-v1, port: 9000, weight: {v1}}}
    - {{name: hello-v2, port: 9000, weight: {v2}}}
  - matches:
    - method: {{service: admin.Tools, method: Reset}}
      headers: [{{name: x-admin, value: "yes"}}]
    backendRefs: [{{name: hello-v1, port: 9000}}]
"""


@pytest.fixture
def mesh(tmp_path: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    spec_dir = tmp_path / "spec"
    spec_dir.mkdir()
    (spec_dir / "services.yaml").write_text(SERVICES)
    (spec_dir / "grpcroute.yaml").write_text(grpc_route(80, 20))
    mesh = Mesh(tmp_path, state_dir, redis_server, spec_dir, injector=True)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()


def certificate(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def common_name(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def key_matches(files: GrpcFolder, cert: x509.Certificate) -> bool:
    key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    return key.public_key().public_bytes(*pem) == cert.public_key().public_bytes(*pem)


def test_the_example_is_valid(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trellis_cli.main", "spec", "validate", str(EXAMPLE)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 with errors" in done.stdout


def bootstrap(mesh: Mesh, service: str, folder: Path) -> GrpcFolder:
    done = mesh.trellis(
        "grpc", "bootstrap", "-n", "shop", "--service", service, "--out", str(folder)
    )
    assert done.returncode == 0, done.stderr
    return GrpcFolder(folder)


class Client:
    """The proxyless client process: one channel, commands in, counts out."""

    def __init__(self, files: GrpcFolder, target: str) -> None:
        env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(files.bootstrap)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trellis_testing.grpcclient", target],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def calls(
        self, method: str, calls: int = 1, metadata: dict[str, str] | None = None
    ) -> dict[str, int]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        command = {"method": method, "calls": calls, "metadata": metadata or {}}
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        answer: dict[str, int] = json.loads(self.process.stdout.readline())
        return answer

    def stop(self) -> None:
        self.process.kill()
        self.process.communicate()  # reaps it and closes its pipes


def test_a_proxyless_client_follows_weighted_and_header_routes_and_live_changes(
    mesh: Mesh, tmp_path: Path
) -> None:
    v1 = GrpcApp("hello-v1").start()
    sidecar = mesh.onboard("hello-v1", "shop", "hello-v1", "hello-v1", app_port=v1.port)
    mesh.register("v1-a", "hello-v1", sidecar.inbound_port, "hello-v1", "shop", port_name="api")
    server_files = bootstrap(mesh, "hello-v2", tmp_path / "hello-v2")
    v2 = GrpcApp("hello-v2").start(tls=(server_files.cert, server_files.key, server_files.ca))
    mesh.register("v2-a", "hello-v2", v2.port, "hello-v2", "shop", port_name="api")
    sidecar.envoy.wait_ready()

    files = bootstrap(mesh, "client", tmp_path / "client")
    document: dict[str, Any] = json.loads(files.bootstrap.read_text())
    assert document["certificate_providers"]["trellis"]["config"]["certificate_file"] == str(
        files.cert
    )
    client = Client(files, "xds:///hello.shop:9000")
    try:

        def routed() -> bool:
            return client.calls("/helloworld.Greeter/SayHello", metadata={"x-version": "2"}) == {
                "hello-v2": 1
            }

        asyncio.run(eventually(routed, timeout=40, interval=0.3, message="proxyless routes"))
        assert client.calls("/helloworld.Greeter/SayHello", 20, metadata={"x-version": "2"}) == {
            "hello-v2": 20
        }
        shares = client.calls("/helloworld.Greeter/SayGoodbye", 300)
        assert set(shares) == {"hello-v1", "hello-v2"}, shares
        assert 195 <= shares["hello-v1"] <= 285, shares  # 240 expected

        (mesh.spec_dir / "grpcroute.yaml").write_text(grpc_route(0, 100))
        changed = time.monotonic()

        def moved() -> bool:
            return client.calls("/helloworld.Greeter/SayGoodbye", 10) == {"hello-v2": 10}

        asyncio.run(eventually(moved, timeout=15, interval=0.05, message="the route change"))
        print(f"proxyless client followed the route change in {time.monotonic() - changed:.2f} s")
        assert client.calls("/helloworld.Greeter/SayGoodbye", 50) == {"hello-v2": 50}
        # no rule matches: UNIMPLEMENTED (GEP-1016), from a fault abort (gRFC A33)
        admin = {"x-admin": "yes"}
        assert client.calls("/admin.Tools/Reset", metadata=admin) == {"hello-v1": 1}
        assert client.calls("/other.Service/Method") == {"UNIMPLEMENTED": 1}  # unknown method
        assert client.calls("/admin.Tools/Reset") == {"UNIMPLEMENTED": 1}  # header unmatched
        assert client.calls("/admin.Tools/reset", metadata=admin) == {"UNIMPLEMENTED": 1}
        assert client.calls("/Admin.Tools/Reset", metadata=admin) == {"UNIMPLEMENTED": 1}

        # the workload's own certificates: one key made on its host, no service key
        proxy_before, before = certificate(files.proxy_cert), certificate(files.cert)
        assert proxy_before.public_key() == before.public_key()
        assert key_matches(files, before)
        spiffe = before.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert spiffe.get_values_for_type(x509.UniformResourceIdentifier) == [
            "spiffe://cluster.local/ns/shop/sa/client"
        ]
        # the agent renews both (a new key, a CSR over mTLS with the proxy certificate)
        agent = subprocess.Popen(
            [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(mesh.state_dir),
             "grpc", "agent", "--out", str(files.folder), "--renew-now"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:

            def renewed() -> bool:
                return certificate(files.cert).serial_number != before.serial_number

            asyncio.run(eventually(renewed, timeout=20, interval=0.1, message="cert.pem renewed"))
            after, proxy_after = certificate(files.cert), certificate(files.proxy_cert)
            assert after.subject == before.subject
            assert common_name(proxy_after) == common_name(proxy_before)
            assert proxy_after.serial_number != proxy_before.serial_number
            assert proxy_after.public_key() == after.public_key() != before.public_key()
            assert key_matches(files, after)
            assert oct(files.key.stat().st_mode & 0o777) == "0o600"
            assert oct(files.proxy_key.stat().st_mode & 0o777) == "0o600"
            # the old proxy certificate is revoked; calls go on with the new files
            revoked = mesh.certmanager(
                "ListRevokedCertificates",
                cm.ListRevokedCertificatesRequest(common_name=common_name(proxy_before)),
            )
            assert [(r.serial, r.reason) for r in revoked.revoked] == [
                (f"{proxy_before.serial_number:x}", "rotated")
            ]
            assert client.calls("/helloworld.Greeter/SayGoodbye", 20) == {"hello-v2": 20}
        finally:
            agent.terminate()
            _, errors = agent.communicate(timeout=10)
        assert "grpc_agent.renewed" in errors

        # the README's third command: the example's client, on the same bootstrap
        env = {**os.environ, "GRPC_XDS_BOOTSTRAP": str(files.bootstrap)}
        example = subprocess.run(
            [sys.executable, str(EXAMPLE / "greeter.py"), "call", "xds:///hello.shop:9000", "20"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert example.returncode == 0, example.stderr
        assert example.stdout.strip() == "{'hello-v2': 20}"
    finally:
        client.stop()
        v1.stop()
        v2.stop()
