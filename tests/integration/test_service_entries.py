"""Istio ServiceEntries next to mesh services, with real Envoy sidecars.

A ``unix://`` endpoint: each proxy that gets the entry gets it as an Envoy ``pipe`` (the
socket at that path on the proxy's own host): every sidecar, state of the world or delta,
ACKs every update (before, the address went out as an IP and each of them NACKed its EDS),
the bookstore is reached, and the entry's host answers from the socket. The entry's status
in ``trellis spec list`` names the endpoint's field and says who does not get it
(proxyless gRPC and Linkerd clients).

``subjectAltNames`` of a MESH_INTERNAL entry: reached with a name the peer's certificate
carries, refused (503) with one it does not.

Hosts on TLS and TCP ports: two TLS servers stand in for external hosts (self-signed
certificates for made-up names) behind two entries that share one port, a TCP echo server
behind a TCP entry, and another behind a MONGO one (whose messages Envoy's Mongo filter
counts). The application connects to its sidecar's listener for the port and names the
host in SNI; the sidecar picks the entry by SNI and passes the TLS through, so the client
validates the server's own certificate. An unknown SNI is refused. A VM sidecar sends a
``resolution: NONE`` TLS host to where the SNI points.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import json
import shutil
import socket
import socketserver
import ssl
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import static_bootstrap
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import RedisServer, eventually
from trellis_testing.envoy import Envoy
from trellis_testing.mesh import Mesh, Sidecar, bookstore
from trellis_testing.ports import free_port

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


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path


def tls_files(folder: Path, host: str) -> TlsFiles:
    """A self-signed certificate for ``host`` and its key, as files (the key is written
    with owner-only permissions, and never printed)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True)
    files = TlsFiles(folder / "cert.pem", folder / "key.pem")
    files.cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    files.key.touch(mode=0o600)
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


class _LineHandler(socketserver.StreamRequestHandler):
    """Answers each line with ``<server name>:<line>`` (TLS handshake first, if any: the
    server records the SNI the client sent)."""

    server: LineApp

    def handle(self) -> None:
        connection = self.connection
        if isinstance(connection, ssl.SSLSocket):
            connection.settimeout(5)
            try:
                connection.do_handshake()
            except (ssl.SSLError, OSError):
                return
        for line in self.rfile:
            self.wfile.write(self.server.name.encode() + b":" + line)
            self.wfile.flush()


class LineApp(socketserver.ThreadingTCPServer):
    """A stand-in for an external host: plain TCP, or TLS with ``files``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, name: str, files: TlsFiles | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _LineHandler)
        self.name = name
        self.context: ssl.SSLContext | None = None
        self.server_names: list[str] = []  # the SNI each TLS client sent
        if files is not None:
            self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.context.load_cert_chain(files.cert, files.key)
            self.context.sni_callback = self._sni
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def _sni(self, connection: ssl.SSLObject, name: str | None, context: ssl.SSLContext) -> None:
        self.server_names.append(name or "")

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        if self.context is None:
            return connection, address
        # the handshake runs in the connection's own thread (handle), not the accept loop
        wrapped = self.context.wrap_socket(
            connection, server_side=True, do_handshake_on_connect=False
        )
        return wrapped, address

    def start(self) -> LineApp:
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


TLS_HOSTS = ("secure.example.test", "other.example.test")
PORT_ENTRIES = """\
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: secure, namespace: bookbuyer}}
spec:
  hosts: [secure.example.test]
  ports: [{{number: {tls_port}, name: tls, protocol: TLS}}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{tls: {secure}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: other, namespace: bookbuyer}}
spec:
  hosts: [other.example.test]
  ports: [{{number: {tls_port}, name: tls, protocol: TLS}}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{tls: {other}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo, namespace: bookbuyer}}
spec:
  hosts: [echo.example.test]
  ports: [{{number: {tcp_port}, name: tcp, protocol: TCP}}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{tcp: {echo}}}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: mongo, namespace: bookbuyer}}
spec:
  hosts: [mongo.example.test]
  ports: [{{number: {mongo_port}, name: mongo, protocol: MONGO}}]
  location: MESH_EXTERNAL
  resolution: STATIC
  endpoints: [{{address: 127.0.0.1, ports: {{mongo: {mongo}}}}}]
"""
# A Mongo OP_QUERY (opcode 2004) for db.c with an empty query document, no newline in it.
OP_QUERY = (
    struct.pack("<iiii", 38, 1, 0, 2004)
    + struct.pack("<i", 0)
    + b"db.c\x00"
    + struct.pack("<ii", 0, 1)
    + b"\x05\x00\x00\x00\x00"
)


@dataclass
class External:
    """The servers behind the TLS and TCP entries, and the ports the entries name (where
    each sidecar listens for them)."""

    tls: dict[str, tuple[LineApp, TlsFiles]]
    echo: LineApp
    mongo: LineApp
    tls_port: int
    tcp_port: int
    mongo_port: int


@pytest.fixture
def external(tmp_path: Path) -> Iterator[External]:
    tls = {}
    for host in TLS_HOSTS:
        files = tls_files(tmp_path / "external" / host, host)
        tls[host] = (LineApp(host, files).start(), files)
    echo, mongo = LineApp("echo").start(), LineApp("mongo").start()
    try:
        yield External(tls, echo, mongo, free_port(), free_port(), free_port())
    finally:
        for app, _ in tls.values():
            app.stop()
        echo.stop()
        mongo.stop()


@pytest.fixture
def mesh(
    tmp_path: Path,
    state_dir: Path,
    redis_server: RedisServer,
    socket_path: Path,
    external: External,
) -> Iterator[Mesh]:
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
    (spec_dir / "local-db.yaml").write_text(ENTRY.format(path=socket_path))
    (spec_dir / "tls-tcp-entries.yaml").write_text(
        PORT_ENTRIES.format(
            tls_port=external.tls_port,
            tcp_port=external.tcp_port,
            secure=external.tls["secure.example.test"][0].port,
            other=external.tls["other.example.test"][0].port,
            echo=external.echo.port,
            mongo_port=external.mongo_port,
            mongo=external.mongo.port,
        )
    )
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


def tls_line(port: int, host: str, context: ssl.SSLContext, line: bytes) -> bytes:
    """One line over TLS to the sidecar's listener on ``port``, naming ``host`` in SNI."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=3) as raw,
        context.wrap_socket(raw, server_hostname=host) as connection,
    ):
        connection.sendall(line + b"\n")
        return connection.makefile("rb").readline()


def tcp_line(port: int, line: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as connection:
        connection.sendall(line + b"\n")
        return connection.makefile("rb").readline()


def answered(call: Callable[[], bytes], expected: bytes) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return call() == expected
        except OSError:  # ssl.SSLError too: the listener or its chain is not there yet
            return False

    return check


def total(mesh: Mesh, name: str) -> int:
    """A counter summed over the sidecars: each binds the entry's port (SO_REUSEPORT),
    and the kernel hands a connection to any of them."""
    return sum(sidecar.envoy.stat(name) for sidecar in mesh.sidecars)


def test_tls_hosts_go_by_sni_and_a_tcp_host_by_port_through_the_sidecar(
    mesh: Mesh, external: External
) -> None:
    bookstore(mesh)
    for host, (app, files) in external.tls.items():
        # the client checks the external server's own certificate: the sidecar passed the
        # application's TLS through (a sidecar that ended it could not show this one)
        verified = ssl.create_default_context(cafile=str(files.cert))
        call = functools.partial(tls_line, external.tls_port, host, verified, b"hello")
        reached = answered(call, f"{host}:hello\n".encode())
        asyncio.run(eventually(reached, timeout=30, interval=0.2, message=host))
        assert app.server_names[-1] == host
        prefix = f"tcp.external_{host}_{external.tls_port}"
        assert total(mesh, f"{prefix}.downstream_cx_total") >= 1
        # the bytes of the TLS session went through that sidecar's chain for the host
        assert total(mesh, f"{prefix}.downstream_cx_rx_bytes_total") > len(b"hello\n")

    echo = functools.partial(tcp_line, external.tcp_port, b"ping")
    asyncio.run(eventually(answered(echo, b"echo:ping\n"), timeout=30, interval=0.2))
    prefix = f"tcp.external_echo.example.test_{external.tcp_port}"
    assert total(mesh, f"{prefix}.downstream_cx_rx_bytes_total") >= len(b"ping\n")
    assert total(mesh, f"{prefix}.downstream_cx_tx_bytes_total") >= len(b"echo:ping\n")

    # MONGO: the same, with Envoy's Mongo filter reading the messages on the way
    query = functools.partial(tcp_line, external.mongo_port, OP_QUERY)
    asyncio.run(eventually(answered(query, b"mongo:" + OP_QUERY + b"\n"), timeout=30))
    assert total(mesh, f"mongo.external_mongo.example.test_{external.mongo_port}.op_query") >= 1

    # a host no entry names: no filter chain, the connection is closed, nothing reached
    unverified = ssl.create_default_context()
    unverified.check_hostname = False
    unverified.verify_mode = ssl.CERT_NONE
    before = sum(len(app.server_names) for app, _ in external.tls.values())
    with pytest.raises((ssl.SSLError, ConnectionError)):
        tls_line(external.tls_port, "unknown.example.test", unverified, b"hello")
    assert sum(len(app.server_names) for app, _ in external.tls.values()) == before
    refused = f"listener.127.0.0.1_{external.tls_port}.no_filter_chain_match"
    assert total(mesh, refused) >= 1

    # every sidecar took every update with these listeners: no NACK, all ACKed
    proxies = {p["proxy"]: p for p in mesh.proxies()}
    for sidecar in mesh.sidecars:
        for kind, state in proxies[sidecar.common_name]["types"].items():
            assert state["nacks"] == 0, (sidecar.common_name, kind, state)
            assert state["acked_version"] == state["sent_version"], (kind, state)


def test_a_vm_sends_a_resolution_none_tls_host_where_its_sni_points(tmp_path: Path) -> None:
    """``resolution: NONE`` on a VM sidecar, with one real Envoy and the translation alone
    (no mesh: the catalog's view is written here). The sidecar listens on 127.0.0.2 and
    the host, ``localhost``, serves TLS on 127.0.0.1 on the entry's port: the sidecar finds
    it by the name in the ClientHello, as the wikipedia entry of Istio's seed needs."""
    files = tls_files(tmp_path / "localhost", "localhost")
    server = LineApp("localhost", files).start()
    port = server.port
    view = pb.View(
        identity="shop/client",
        namespace="shop",
        service="client",
        service_account="client",
        spiffe_id="spiffe://cluster.local/ns/shop/sa/client",
        version="1",
        mesh=pb.MeshSettings(trust_domain="cluster.local"),
        external=[
            pb.ExternalService(
                host="localhost", port=port, protocol="tls", cluster=f"shop/local|{port}"
            )
        ],
        clusters=[
            pb.Cluster(
                name=f"shop/local|{port}",
                namespace="shop",
                service="local",
                port=port,
                protocol="tcp",
                discovery="PASSTHROUGH",
            )
        ],
    )
    settings = ProxySettings(
        outbound_address="127.0.0.2", outbound_port=free_port(), inbound_port=free_port()
    )
    envoy = Envoy(static_bootstrap(translate(view, settings, None)), tmp_path / "envoy")
    try:
        envoy.start().wait_ready()
        verified = ssl.create_default_context(cafile=str(files.cert))

        def line() -> bytes:
            with (
                socket.create_connection(("127.0.0.2", port), timeout=3) as raw,
                verified.wrap_socket(raw, server_hostname="localhost") as connection,
            ):
                connection.sendall(b"hello\n")
                return connection.makefile("rb").readline()

        reached = answered(line, b"localhost:hello\n")
        asyncio.run(eventually(reached, timeout=20, interval=0.2, message="localhost"))
        assert server.server_names[-1] == "localhost"
        prefix = f"tcp.external_localhost_{port}"
        assert envoy.stat(f"{prefix}.downstream_cx_rx_bytes_total") > len(b"hello\n")
    finally:
        envoy.stop()
        server.stop()
