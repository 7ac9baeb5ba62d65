"""OSM's Egress and IngressBackend against real Envoy sidecars: calls out of the mesh allowed
and denied by host, port and path (and a raw TCP tunnel by address), and plaintext from
outside the mesh admitted to an inbound port only while an IngressBackend says so.

The services (and their Redis, state directory and spec directory) start once for the
module, and its tests share them: each onboards its own bookstore (fresh Envoys), and after
each its sidecars and apps are stopped, its workloads deregistered and the policies it wrote
removed, until the mesh answers as before the first test (:class:`Baseline`).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import httpx
import pytest

from trellis_identity.trustctx import system_context
from trellis_testing import eventually
from trellis_testing.apps import TcpApp
from trellis_testing.baseline import BOOKSTORE_WORKLOADS, Baseline, module_mesh
from trellis_testing.mesh import Mesh, Sidecar, bookstore

# one mesh for the module (its fixtures): its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("osm-edge-mesh")]
MESH_NAME = "osm-edge"

ROOT = Path(__file__).resolve().parents[2]


shared, mesh = module_mesh(
    MESH_NAME,
    ROOT / "examples" / "bookstore",
    Mesh,
    lambda mesh: Baseline(mesh, registered=BOOKSTORE_WORKLOADS),
)


EGRESS = """
apiVersion: specs.smi-spec.io/v1alpha4
kind: HTTPRouteGroup
metadata: {name: outside-reads, namespace: bookbuyer}
spec:
  matches: [{name: allowed, pathRegex: "/allowed.*", methods: [GET]}]
---
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Egress
metadata: {name: outside, namespace: bookbuyer}
spec:
  sources: [{kind: ServiceAccount, name: bookbuyer, namespace: bookbuyer}]
  hosts: [localhost]
  ports: [{number: PORT, protocol: http}]
  matches:
  - {apiGroup: specs.smi-spec.io/v1alpha4, kind: HTTPRouteGroup, name: outside-reads}
"""


def _status(sidecar: Sidecar, host: str, path: str) -> int:
    try:
        return sidecar.get(host, path, timeout=3).status_code
    except httpx.HTTPError:
        return 0


def test_egress_allows_its_host_port_and_paths_and_denies_the_rest(mesh: Mesh) -> None:
    v1, _v2, buyer = bookstore(mesh)
    outside, other = mesh.app("outside"), mesh.app("other")
    allowed = f"localhost:{outside.port}"
    assert _status(buyer, allowed, "/allowed") == 404  # egress off and no policy: denied

    (mesh.spec_dir / "egress.yaml").write_text(EGRESS.replace("PORT", str(outside.port)))
    asyncio.run(
        eventually(
            lambda: _status(buyer, allowed, "/allowed") == 200,
            timeout=20,
            interval=0.2,
            message="the Egress reached bookbuyer's sidecar",
        )
    )
    answer = buyer.get(allowed, "/allowed/books")
    assert answer.json()["app"] == "outside"
    assert answer.json()["caller"] == ""  # plain HTTP to the outside: no mesh identity

    before = outside.requests
    assert _status(buyer, allowed, "/denied") == 404  # by path
    assert _status(buyer, f"localhost:{other.port}", "/allowed") == 404  # by port
    assert _status(buyer, f"127.0.0.1:{outside.port}", "/allowed") == 404  # by host
    assert _status(v1, allowed, "/allowed") == 404  # not a source of the policy
    assert outside.requests == before
    assert other.requests == 0

    (mesh.spec_dir / "egress.yaml").unlink()
    asyncio.run(
        eventually(
            lambda: _status(buyer, allowed, "/allowed") == 404,
            timeout=20,
            interval=0.2,
            message="the deleted Egress left bookbuyer's sidecar",
        )
    )


TCP_EGRESS = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: Egress
metadata: {name: ledger, namespace: bookbuyer}
spec:
  sources: [{kind: ServiceAccount, name: bookbuyer, namespace: bookbuyer}]
  ipAddresses: [127.0.0.0/30]
  ports: [{number: PORT, protocol: tcp}]
"""


def _tunnel(sidecar: Sidecar, target: str) -> tuple[str, bytes]:
    """CONNECT through the sidecar: its status line, and the first line past the tunnel."""
    with socket.create_connection(("127.0.0.1", sidecar.outbound_port), timeout=5) as conn:
        conn.settimeout(5)
        conn.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = conn.recv(4096)
            if not chunk:
                break
            received += chunk
        head, _, rest = received.partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].decode()
        if " 200 " in f"{status} " and b"\n" not in rest:
            rest += conn.recv(4096)
        return status, rest


def test_tcp_egress_tunnels_to_addresses_in_its_ranges_only(mesh: Mesh) -> None:
    _v1, _v2, buyer = bookstore(mesh)
    ledger = TcpApp("ledger").start()
    try:
        text = TCP_EGRESS.replace("PORT", str(ledger.port))
        (mesh.spec_dir / "tcp-egress.yaml").write_text(text)
        inside = f"127.0.0.1:{ledger.port}"

        def tunnelled() -> bool:
            try:
                return _tunnel(buyer, inside)[1] == b"ledger\n"
            except OSError:
                return False

        asyncio.run(eventually(tunnelled, timeout=20, interval=0.2, message="tunnel to ledger"))
        status, _ = _tunnel(buyer, f"127.0.0.9:{ledger.port}")  # outside 127.0.0.0/30
        assert " 404 " in status, status
        assert ledger.connections == 1
    finally:
        ledger.stop()


def _plaintext(sidecar: Sidecar) -> int:
    """A plaintext request from outside the mesh straight to the sidecar's inbound port."""
    try:
        url = f"http://127.0.0.1:{sidecar.inbound_port}/books"
        return httpx.get(
            url, headers={"host": "bookstore-v1"}, timeout=3, verify=system_context()
        ).status_code
    except httpx.HTTPError:
        return 0  # closed: no filter chain takes plaintext from this address


INGRESS = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: IngressBackend
metadata: {name: nginx, namespace: bookstore}
spec:
  backends: [{name: bookstore-v1, port: {number: 14001, protocol: http}}]
  sources: [{kind: IPRange, name: RANGE}]
"""


def _ingress_chain(sidecar: Sidecar) -> bool:
    dump = sidecar.envoy.get("/config_dump?resource=dynamic_listeners").text
    return "ingress|bookstore/nginx" in dump


def test_plaintext_is_admitted_only_by_an_ingress_backend_and_only_from_its_sources(
    mesh: Mesh,
) -> None:
    v1, _v2, _buyer = bookstore(mesh)
    app = mesh.apps[0]
    assert _plaintext(v1) == 0  # the inbound port speaks mTLS only

    policy = mesh.spec_dir / "ingress.yaml"
    policy.write_text(INGRESS.replace("RANGE", "10.0.0.0/8"))
    asyncio.run(eventually(lambda: _ingress_chain(v1), timeout=20, interval=0.2, message="chain"))
    assert _plaintext(v1) == 0  # 127.0.0.1 is not a source

    before = app.requests
    policy.write_text(INGRESS.replace("RANGE", "127.0.0.1/32"))
    asyncio.run(
        eventually(lambda: _plaintext(v1) == 200, timeout=20, interval=0.2, message="admitted")
    )
    assert app.requests > before

    policy.unlink()
    # Wait on the chain leaving, then ask: a refusal seen earlier could be a request that
    # timed out under load while the chain was still there.
    asyncio.run(
        eventually(lambda: not _ingress_chain(v1), timeout=20, interval=0.2, message="chain gone")
    )
    assert _plaintext(v1) == 0


SKIPPING = """
apiVersion: policy.openservicemesh.io/v1alpha1
kind: IngressBackend
metadata: {name: nginx, namespace: bookstore}
spec:
  backends:
  - name: bookstore-v1
    port: {number: 14001, protocol: https}
    tls: {skipClientCertValidation: true, sniHosts: [books.example.com]}
  sources: [{kind: IPRange, name: 127.0.0.1/32}]
"""


def _tls(sidecar: Sidecar, server_name: str) -> int:
    """HTTPS from outside the mesh, with no client certificate, to the inbound port."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the test checks admission, not the server's name
    try:
        with httpx.Client(verify=context, timeout=3) as client:
            url = f"https://127.0.0.1:{sidecar.inbound_port}/books"
            extensions = {"sni_hostname": server_name}
            return client.get(url, extensions=extensions).status_code
    except httpx.HTTPError:
        return 0


def test_tls_without_a_client_certificate_only_when_the_backend_skips_validation(
    mesh: Mesh,
) -> None:
    v1, _v2, _buyer = bookstore(mesh)
    assert _tls(v1, "books.example.com") == 0  # the mesh's chain wants a client certificate
    (mesh.spec_dir / "ingress.yaml").write_text(SKIPPING)
    asyncio.run(
        eventually(
            lambda: _tls(v1, "books.example.com") == 200,
            timeout=20,
            interval=0.2,
            message="admitted without a client certificate",
        )
    )
    assert _tls(v1, "other.example.com") == 0  # another server name meets the mesh's chain
