"""Envoy resources folded into a static bootstrap that ``envoy --mode validate`` judges
offline (RDS inlined, EDS made static, SDS secrets made static), and real key material for
it: the translation tests' way of letting Envoy itself reject a field."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from trellis_api import catalog_pb2 as pb
from trellis_proxy_cp.translate.proxy import Resources
from trellis_proxy_cp.translate.secrets import SecretMaterial


def as_dict(message: Message) -> dict[str, Any]:
    body: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return body


def static_bootstrap(resources: Resources) -> dict[str, Any]:
    """Fold dynamic references into a static configuration Envoy validates offline."""
    routes = {r["name"]: r for r in map(as_dict, resources.routes)}
    loads = {e["cluster_name"]: e for e in map(as_dict, resources.endpoints)}

    def fold(node: Any) -> Any:
        if isinstance(node, dict):
            if "rds" in node:
                name = node.pop("rds")["route_config_name"]
                node["route_config"] = routes[name]
            node.pop("sds_config", None)
            return {k: fold(v) for k, v in node.items()}
        if isinstance(node, list):
            return [fold(v) for v in node]
        return node

    clusters = []
    for item in map(as_dict, resources.clusters):
        if item.get("type") == "EDS":
            item.pop("eds_cluster_config")
            item["type"] = "STATIC"
            item["load_assignment"] = loads[item["name"]]
        clusters.append(fold(item))
    secrets = [as_dict(s) for s in resources.secrets]
    return {
        "static_resources": {
            "listeners": [fold(as_dict(item)) for item in resources.listeners],
            "clusters": clusters,
            "secrets": secrets,
        }
    }


def self_signed_material() -> SecretMaterial:
    """A real certificate and key: validate mode loads secrets."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return SecretMaterial(pem, key_pem, pem)


BOOKSTORE_SPIFFE = "spiffe://cluster.local/ns/bookstore/sa/bookstore"


def cluster(
    name: str,
    *endpoints: tuple[str, int],
    discovery: str = "STATIC",
    protocol: str = "http",
    mesh_tls: bool = True,
    spiffe: str = BOOKSTORE_SPIFFE,
) -> pb.Cluster:
    """A view's cluster ``<namespace>/<service>|<port>`` with ``endpoints`` (locality
    eu/west) whose workloads run as ``spiffe``."""
    namespace, rest = name.split("/")
    service, port = rest.split("|")
    return pb.Cluster(
        name=name,
        namespace=namespace,
        service=service,
        port=int(port),
        protocol=protocol,
        discovery=discovery,
        mesh_tls=mesh_tls,
        spiffe_ids=[spiffe] if mesh_tls else [],
        endpoints=[
            pb.ClusterEndpoint(address=a, port=p, weight=1, locality="eu/west")
            for a, p in endpoints
        ],
    )


BUYER_SPIFFE = "spiffe://cluster.local/ns/bookbuyer/sa/bookbuyer"


def buyer_view() -> pb.View:
    """bookbuyer's view: the bookstore split (80/20), bookstore-v1 by route, an external
    host, a passthrough and a gRPC cluster."""
    v1, v2 = "bookstore/bookstore-v1|14001", "bookstore/bookstore-v2|14001"
    return pb.View(
        identity="bookbuyer/bookbuyer",
        namespace="bookbuyer",
        service="bookbuyer",
        service_account="bookbuyer",
        spiffe_id=BUYER_SPIFFE,
        outbound=[
            pb.OutboundService(
                namespace="bookstore",
                name="bookstore",
                port=14001,
                protocol="http",
                hostnames=["bookstore", "bookstore.bookstore", "bookstore:14001"],
                routes=[
                    pb.Route(
                        name="split",
                        match=pb.HttpMatch(path_regex=".*"),
                        clusters=[
                            pb.WeightedCluster(cluster=v1, weight=80),
                            pb.WeightedCluster(cluster=v2, weight=20),
                        ],
                    )
                ],
            ),
            pb.OutboundService(
                namespace="bookstore",
                name="bookstore-v1",
                port=14001,
                protocol="http",
                hostnames=["bookstore-v1", "bookstore:14001"],  # a domain taken above
                routes=[
                    pb.Route(
                        name="default",
                        match=pb.HttpMatch(
                            path_regex="/books.*",
                            methods=["GET", "POST"],
                            headers={"X-Tenant": "a.*"},
                        ),
                        clusters=[pb.WeightedCluster(cluster=v1, weight=100)],
                    )
                ],
            ),
        ],
        external=[
            pb.ExternalService(
                host="api.example.com", port=80, protocol="http", cluster="shop/api.example.com|80"
            )
        ],
        clusters=[
            cluster(v1, ("10.0.0.1", 8081), ("10.0.0.2", 8081)),
            cluster(v2, ("10.0.0.3", 8082)),
            cluster(
                "shop/api.example.com|80", ("api.example.com", 80), discovery="DNS", mesh_tls=False
            ),
            cluster(
                "shop/passthrough.example|443",
                discovery="PASSTHROUGH",
                protocol="tcp",
                mesh_tls=False,
            ),
            cluster("grpc/echo|9000", ("10.0.0.9", 9000), protocol="grpc"),
        ],
    )
