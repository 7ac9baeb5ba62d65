"""Istio ServiceEntries next to mesh services, with real Envoy sidecars.

A ``unix://`` endpoint: each proxy that gets the entry gets it as an Envoy ``pipe`` (the
socket at that path on the proxy's own host): every sidecar, state of the world or delta,
ACKs every update (before, the address went out as an IP and each of them NACKed its EDS),
the bookstore is reached, and the entry's host answers from the socket. The entry's status
in ``trellis spec list`` names the endpoint's field and says who does not get it
(proxyless gRPC and Linkerd clients).

``subjectAltNames`` of a MESH_INTERNAL entry: reached with a name the peer's certificate
carries, refused (503) with one it does not.
"""

from __future__ import annotations

import asyncio
import functools
import json
import shutil
import socketserver
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from trellis_common.testing import RedisServer, eventually
from trellis_common.testing.mesh import Mesh, Sidecar, bookstore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

ENTRY = """\
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: local-db, namespace: bookbuyer}}
spec:
  hosts: [local-db.internal]
  ports: [{{number: 8000, name: http, protocol: HTTP}}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{address: "unix://{path}"}}]
"""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        body = json.dumps({"app": "unix-db", "path": self.path}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


class UnixApp(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path) -> None:
        super().__init__(str(path), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def start(self) -> UnixApp:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def served(buyer: Sidecar, host: str, path: str, apps: set[str]) -> bool:
    try:
        answer = buyer.get(host, path, timeout=2)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json()["app"] in apps


def reaches_bookstore(buyer: Sidecar) -> bool:
    return served(buyer, "bookstore.bookstore:14001", "/books-bought", {"v1", "v2"})


def reaches_socket(buyer: Sidecar) -> bool:
    return served(buyer, "local-db.internal:8000", "/rows", {"unix-db"})


@pytest.fixture
def socket_path() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="trellis-uds-", dir="/tmp"))  # short: 108 bytes
    try:
        yield folder / "db.sock"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def mesh(
    tmp_path: Path, state_dir: Path, redis_server: RedisServer, socket_path: Path
) -> Iterator[Mesh]:
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
    (spec_dir / "local-db.yaml").write_text(ENTRY.format(path=socket_path))
    mesh = Mesh(tmp_path, state_dir, redis_server, spec_dir, vm_spec_dir=True)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()


def test_a_unix_endpoint_is_a_pipe_that_poisons_no_update(mesh: Mesh, socket_path: Path) -> None:
    app = UnixApp(socket_path).start()
    try:
        _v1, _v2, delta = bookstore(mesh)  # bookbuyer on delta ADS: one resource at a time
        # state of the world: the entry's load assignment comes in the same EDS response
        # as the bookstore's, which Envoy takes or refuses whole
        sotw = mesh.onboard("bookbuyer-sotw", "bookbuyer", "bookbuyer", "bookbuyer")
        sotw.envoy.wait_ready()
        for buyer in (sotw, delta):
            for check in (reaches_bookstore, reaches_socket):
                reached = functools.partial(check, buyer)
                what = f"{buyer.common_name} {check.__name__}"
                asyncio.run(eventually(reached, timeout=20, interval=0.2, message=what))

        # every proxy the entry is exported to took every update: no NACK, all ACKed
        proxies = {p["proxy"]: p for p in mesh.proxies()}
        for sidecar in mesh.sidecars:
            for kind, state in proxies[sidecar.common_name]["types"].items():
                assert state["nacks"] == 0, (sidecar.common_name, kind, state)
                assert state["acked_version"] == state["sent_version"], (kind, state)

        done = mesh.trellis("spec", "list", "--state", "warning", "--json")
        assert done.returncode == 0, done.stderr
        [entry] = [r for r in json.loads(done.stdout)["resources"] if r["kind"] == "ServiceEntry"]
        assert entry["field"] == "spec.endpoints[0].address"
        assert "proxyless gRPC and Linkerd clients do not get it" in entry["reason"]
    finally:
        app.stop()


INTERNAL_ENTRY = """\
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: store-direct, namespace: bookbuyer}}
spec:
  hosts: [store-direct.internal]
  ports: [{{number: 14001, name: http, protocol: HTTP}}]
  location: MESH_INTERNAL
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{http: {port}}}}}]
  subjectAltNames: ["{san}"]
"""
PERMISSIVE = """\
apiVersion: config.openservicemesh.io/v1alpha2
kind: MeshConfig
metadata: {name: osm-mesh-config, namespace: trellis-system}
spec: {traffic: {enablePermissiveTrafficPolicyMode: true}}
"""


def test_a_mesh_internal_entry_reaches_only_a_peer_with_one_of_its_names(
    mesh: Mesh, socket_path: Path
) -> None:
    """``subjectAltNames`` of a MESH_INTERNAL entry whose endpoint (bookstore-v1's sidecar)
    names no service account: the peer's certificate must carry one of them."""
    (mesh.spec_dir / "meshconfig.yaml").write_text(PERMISSIVE)  # no account to grant
    v1, _v2, buyer = bookstore(mesh)
    entry = mesh.spec_dir / "store-direct.yaml"
    store = "spiffe://cluster.local/ns/bookstore/sa/bookstore"
    host = "store-direct.internal:14001"

    def answers(status: int) -> Callable[[], bool]:
        def check() -> bool:
            try:
                return buyer.get(host, "/books-bought", timeout=2).status_code == status
            except httpx.HTTPError:
                return False

        return check

    entry.write_text(INTERNAL_ENTRY.format(port=v1.inbound_port, san=store))
    asyncio.run(eventually(answers(200), timeout=20, interval=0.2, message="the right name"))
    assert buyer.get(host, "/books-bought").json()["app"] == "v1"

    wrong = "spiffe://cluster.local/ns/bookstore/sa/not-bookstore"
    entry.write_text(INTERNAL_ENTRY.format(port=v1.inbound_port, san=wrong))
    asyncio.run(eventually(answers(503), timeout=20, interval=0.2, message="a wrong name"))
    # bookstore-v1 is up and serves by its own name all along
    assert buyer.get("bookstore.bookstore:14001", "/books-bought").status_code == 200
