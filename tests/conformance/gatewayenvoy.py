"""A Trellis gateway made from upstream's manifests, served by a real Envoy, with echo
backends that say who answered: the traffic half of the conformance tests.

The path a Gateway's config takes in production, minus the network between the parts:

1. the catalog (:class:`trellis_catalog.catalog.Catalog`, with the documents and one
   provider report per Service) computes the gateway identity's policy, and its gRPC
   transport's :func:`~trellis_catalog.transport.protos.to_proto` makes the view;
2. proxy-cp's :func:`~trellis_proxy_cp.translate.proxy.translate` turns the view into Envoy
   resources (``gateway=True``), folded into a static bootstrap
   (:func:`~trellis_proxy_cp.testing.static.static_bootstrap`) that one Envoy runs.

Two edits are made to the view between 1 and 2, and only these: every cluster's endpoints
are replaced by the local echo server of its Service, reached **without mesh mTLS**
(``mesh_tls`` off: a backend here is a plain process, not a workload with a sidecar; the
routing is what these cases test), and each gateway port (80, 8080...) is moved to a free
local port. The echo servers answer like upstream's ``echo-basic``: the pod (the Service's
name), its namespace, and the request's path, method, host and headers as received; a
cluster that speaks HTTP/2 (``grpc``, or ``http2``: upstream's gRPC backends declare
``appProtocol: kubernetes.io/h2c``) gets a gRPC echo server
(:class:`~trellis_testing.grpcapp.GrpcApp`), which names itself in its answer.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import ssl
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

import grpc
import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conformance.upstream import documents, reports
from trellis_api import catalog_pb2 as pb
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.transport.protos import to_proto
from trellis_common.bootstrap import KEY_FILE, WORKLOAD_CERT_FILE
from trellis_proxy_cp.testing.static import self_signed_material, static_bootstrap
from trellis_proxy_cp.translate.proxy import translate
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_spec import mesh as meshspec
from trellis_testing import envoy
from trellis_testing.grpcapp import GrpcApp
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: EchoServer

    def _answer(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        body = json.dumps(
            {
                "pod": self.server.pod,
                "namespace": self.server.namespace,
                "path": self.path,
                "method": self.command,
                "host": self.headers.get("host", ""),
                "headers": {
                    name.lower(): ",".join(self.headers.get_all(name) or [])
                    for name in dict.fromkeys(self.headers.keys())
                },
            }
        ).encode()
        self.send_response(200)
        for item in filter(None, (self.headers.get("x-echo-set-header") or "").split(",")):
            name, _, value = item.partition(":")
            self.send_header(name, value)  # what upstream's echo-basic sets when asked
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer
    do_CONNECT = do_TRACE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        return


class EchoServer(ThreadingHTTPServer):
    """upstream's echo-basic, for HTTP: answers any method with what it received."""

    daemon_threads = True

    def __init__(self, namespace: str, pod: str) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.namespace, self.pod = namespace, pod
        self._thread = Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@dataclass
class Echoed:
    """One answer through the gateway: the status, and what the backend saw (200 only)."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)  # the response's, lower case


@dataclass
class Gateway:
    """The running gateway: ``ports`` maps each Gateway port to the local one."""

    ports: dict[int, int]
    proxy: envoy.Envoy

    def get(
        self,
        path: str,
        host: str = "",
        port: int = 80,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
    ) -> Echoed:
        sent = dict(headers or {})
        if host:
            sent["host"] = host
        answer = httpx.request(
            method, f"http://127.0.0.1:{self.ports[port]}{path}", headers=sent, timeout=5
        )
        return _echoed(answer.status_code, answer.headers, answer.content)

    def get_tls(self, path: str, host: str, ca: Path, port: int = 443) -> Echoed:
        """One HTTP/1.1 request over TLS, ``host`` as SNI and Host, the server's certificate
        verified against ``ca`` (upstream's ``MakeTLSRequest...``)."""
        context = ssl.create_default_context(cafile=str(ca))
        context.set_alpn_protocols(["http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", self.ports[port]), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname=host) as connection,
        ):
            request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
            connection.sendall(request.encode())
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        headers = httpx.Headers([(k, v) for k, _, v in (line.partition(": ") for line in lines)])
        return _echoed(int(status_line.split()[1]), headers, body)

    def grpc(
        self, method: str, authority: str = "", metadata: tuple[tuple[str, str], ...] = ()
    ) -> tuple[grpc.StatusCode, dict[str, Any]]:
        """Call ``method`` (``/service/method``) through the gateway's port 80 with
        ``authority``: the status, and the backend's answer (OK only)."""
        options = [("grpc.default_authority", authority)] if authority else []
        with grpc.insecure_channel(f"127.0.0.1:{self.ports[80]}", options=options) as channel:
            stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
            try:
                body: dict[str, Any] = json.loads(stub(b"", metadata=metadata, timeout=5))
            except grpc.RpcError as error:
                return error.code(), {}
            return grpc.StatusCode.OK, body


def _echoed(status: int, headers: httpx.Headers, content: bytes) -> Echoed:
    found = {name: ",".join(headers.get_list(name)) for name in headers}
    if status == 200 and headers.get("content-type") == "application/json":
        return Echoed(200, json.loads(content), found)
    return Echoed(status, {}, found)


def view_of(raws: list[dict[str, Any]], gateway: Identity) -> pb.View:
    """The gateway identity's view as the catalog serves it."""

    found = documents(raws)
    catalog = Catalog()
    catalog.set_documents(found, [])
    catalog.set_provider_services("k8s", reports(meshspec.build(found)))
    catalog.flush()
    return to_proto(catalog.policy_for(gateway, gateway.service), catalog.clusters)


def write_certificate(folder: Path, hosts: Iterable[str]) -> Path:
    """A self-signed certificate for ``hosts`` and its key, laid out as a Secret volume
    (``tls.crt``, ``tls.key``) in ``folder``: the certificate's path (a client's CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names = list(hosts)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True)
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return folder / "tls.crt"


@contextmanager
def serving(
    raws: list[dict[str, Any]],
    gateway: Identity,
    workdir: Path,
    certificates: Mapping[str, Iterable[str]] | None = None,
) -> Iterator[Gateway]:
    """One Envoy serving ``gateway`` (its view edited as the module says), and an echo
    server for each backend; all stopped on exit. ``certificates``: the Secrets
    (``namespace/name``) the Gateway's HTTPS listeners name, made for those host names
    (upstream's suite creates them), in the folder the gateway reads them from."""
    certs = workdir / "gateway-certs"
    for secret, hosts in (certificates or {}).items():
        write_certificate(certs / secret, hosts)
    view = view_of(raws, gateway)
    http_servers: list[EchoServer] = []
    grpc_servers: list[GrpcApp] = []
    try:
        for cluster in view.clusters:
            if cluster.protocol in ("grpc", "http2"):  # h2c: upstream's gRPC backends
                app = GrpcApp(cluster.service).start()
                grpc_servers.append(app)
                port = app.port
            else:
                server = EchoServer(cluster.namespace, cluster.service)
                http_servers.append(server)
                port = server.port
            del cluster.endpoints[:]
            cluster.endpoints.append(pb.ClusterEndpoint(address="127.0.0.1", port=port, weight=1))
            cluster.mesh_tls = False
            del cluster.spiffe_ids[:]
        ports = {}
        for item in view.gateway_ports:
            ports[item.port] = item.port = free_port()
        material = self_signed_material()
        folder = workdir / "proxy"
        folder.mkdir(parents=True)
        (folder / WORKLOAD_CERT_FILE).write_bytes(material.cert_chain_pem)
        (folder / KEY_FILE).write_bytes(material.key_pem)
        settings = ProxySettings(
            gateway=True,
            workload_dir=str(folder),
            gateway_certs_dir=str(certs) if certificates else "",
        )
        resources = translate(view, settings, material)
        proxy = envoy.Envoy(static_bootstrap(resources), workdir / "envoy", "gateway")
        try:
            proxy.start().wait_ready()
            yield Gateway(ports, proxy)
        finally:
            proxy.stop()
    finally:
        for server in http_servers:
            server.stop()
        for app in grpc_servers:
            app.stop()


def settle(gateway: Gateway, port: int = 80) -> None:
    """Wait until the listener on ``port`` answers (any status): Envoy is ready before its
    listeners are bound."""

    def answers() -> bool:
        try:
            gateway.get("/", port=port)
        except httpx.TransportError:
            return False
        return True

    asyncio.run(eventually(answers, timeout=10, message=f"the gateway's port {port}"))
