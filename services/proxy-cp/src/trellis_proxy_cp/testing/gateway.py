"""A Gateway's view as the catalog makes it, written by hand, and its listener
certificates as files: the gateway translation tests' inputs (translate/gateway_listeners.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.testing.static import cluster

WEB, HELLO = "shop/web|8080", "shop/hello|9000"
SHOP = "spiffe://cluster.local/ns/shop/sa"


def rules(backend: str, kind: str = "HTTPRoute shop/web", prefix: str = "/") -> list[pb.Route]:
    """One rule to ``backend``, then the catch-all 404 (as the catalog ends every host);
    ``PathPrefix: /`` comes as no path at all (the catalog drops a trailing ``/``)."""
    return [
        pb.Route(
            name=f"{kind} rule 0 match 0",
            source=f"{kind} rule 0",
            match=pb.HttpMatch(path_prefix=prefix.rstrip("/")),
            clusters=[pb.WeightedCluster(cluster=backend, weight=1)],
            invalid_status=503 if kind.startswith("GRPCRoute") else 500,
        ),
        pb.Route(name="no-route", match=pb.HttpMatch(), direct_status=404),
    ]


def server(
    listener: str, hostname: str, routes: list[pb.Route], cert: str = ""
) -> pb.GatewayServer:
    found = pb.GatewayServer(
        listener=f"edge/gw/{listener}",
        hostname=hostname,
        virtual_hosts=[pb.GatewayVirtualHost(domains=[hostname or "*"], routes=routes)],
    )
    if cert:
        found.tls_mode = "Terminate"
        found.certificates.append(pb.SecretRef(namespace="edge", name=cert))
    return found


def gateway_view(
    http: int = 8080, https: int = 8443, backends: list[pb.Cluster] | None = None
) -> pb.View:
    """edge/gw: on ``http``, any name to web and gRPC to hello, foo.example.com to web;
    on ``https``, foo.example.com and bar.example.com, each with its own certificate."""
    grpc_rule = rules(HELLO, "GRPCRoute shop/hello", "/helloworld.Greeter")[0]
    return pb.View(
        identity="edge/gw",
        namespace="edge",
        service="gw",
        service_account="gw",
        spiffe_id="spiffe://cluster.local/ns/edge/sa/gw",
        version="1",
        mesh=pb.MeshSettings(trust_domain="cluster.local"),
        clusters=backends
        or [
            cluster(WEB, ("10.0.0.1", 8080), spiffe=f"{SHOP}/web"),
            cluster(HELLO, ("10.0.0.2", 9000), protocol="grpc", spiffe=f"{SHOP}/hello"),
        ],
        gateway_ports=[
            pb.GatewayPort(
                port=http,
                protocol="HTTP",
                servers=[
                    server("http", "", [grpc_rule, *rules(WEB)]),
                    server("foo", "foo.example.com", rules(WEB, prefix="/foo")),
                ],
            ),
            pb.GatewayPort(
                port=https,
                protocol="HTTPS",
                servers=[
                    server("https-foo", "foo.example.com", rules(WEB), cert="foo-cert"),
                    server("https-bar", "bar.example.com", [grpc_rule, *rules(WEB)], "bar-cert"),
                ],
            ),
        ],
    )


def write_certificate(folder: Path, host: str) -> bytes:
    """A self-signed certificate for ``host`` and its key as a Secret volume holds them
    (``tls.crt``, ``tls.key``); the certificate's PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    folder.mkdir(parents=True)
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (folder / "tls.crt").write_bytes(pem)
    (folder / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    (folder / "tls.key").chmod(0o600)
    return pem
