"""A control plane with inputs and connected proxies (core, admin API, the CLI's tests).

The catalog and certmanager as :class:`~trellis_proxy_cp.core.ProxyControlPlane` sees them
(two fetch functions, ``forget`` and ``on_refused``), recording every call; views that
translate to a consistent snapshot; and proxies connected the way the authorizer and the
ADS server connect them, without a gRPC stream."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from envoy.config.core.v3 import base_pb2

from trellis_api import catalog_pb2
from trellis_common.ids import ProxyCommonName
from trellis_proxy_cp.cache import inputs
from trellis_proxy_cp.cache.snapshot import Snapshot
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRegistry
from trellis_proxy_cp.transport.streams import envoy_version as envoy_version_of
from trellis_proxy_cp.types import TypeUrl

_PREFIX = "type.googleapis.com/"


KEY_PEM = (
    b"-----BEGIN PRIVATE KEY-----\n"
    b"VFJFTExJUy1URVNULUtFWS1USEFULU1VU1QtTkVWRVItQkUtU0hPV04=\n"
    b"-----END PRIVATE KEY-----\n"
)
"""A private key that the admin API must never show (nor its base64)."""

SPIFFE_PREFIX = "spiffe://cluster.local/ns/"
#: A sidecar as every onboarding path makes one: its own workload certificate and key in
#: its folder (a pod agent's, here), which proxy-cp names and never sends.
SIDECAR = ProxySettings(workload_dir="/etc/trellis/proxy")


def proxy_common_name(service: str, namespace: str, number: int = 1) -> str:
    """A proxy certificate's common name ``<uuid>.<service>.<namespace>``, stable per number."""
    return f"00000000-0000-4000-8000-{number:012d}.{service}.{namespace}"


def view(
    identity: str = "bookstore/bookstore",
    version: str = "1",
    *,
    upstream: str = "bookstore/reviews",
    upstream_port: int = 9080,
    endpoints: tuple[str, ...] = ("10.0.0.1",),
    discovery: str = "STATIC",
) -> catalog_pb2.View:
    """A catalog view that translates to a consistent snapshot: an HTTP inbound port any mesh
    identity may call, and one HTTP upstream with its cluster."""
    pb = catalog_pb2
    namespace, service = identity.split("/")
    up_namespace, up_service = upstream.split("/")
    cluster_name = f"{upstream}|{upstream_port}"
    up_spiffe = f"{SPIFFE_PREFIX}{up_namespace}/sa/{up_service}"
    return pb.View(
        identity=identity,
        namespace=namespace,
        service=service,
        service_account=service,
        spiffe_id=f"{SPIFFE_PREFIX}{namespace}/sa/{service}",
        version=version,
        outbound=[
            pb.OutboundService(
                namespace=up_namespace,
                name=up_service,
                port=upstream_port,
                protocol="http",
                hostnames=[up_service, f"{up_service}.{up_namespace}"],
                routes=[
                    pb.Route(
                        name="default",
                        match=pb.HttpMatch(path_regex=".*"),
                        clusters=[pb.WeightedCluster(cluster=cluster_name, weight=100)],
                    )
                ],
                spiffe_ids=[up_spiffe],
            )
        ],
        inbound=[
            pb.InboundPort(
                port=14001, target_port=8080, protocol="http", name="http", allow_any=True
            )
        ],
        clusters=[
            pb.Cluster(
                name=cluster_name,
                namespace=up_namespace,
                service=up_service,
                port=upstream_port,
                protocol="http",
                discovery=discovery,
                endpoints=[
                    pb.ClusterEndpoint(address=address, port=upstream_port, weight=1)
                    for address in endpoints
                ],
                spiffe_ids=[up_spiffe],
                mesh_tls=True,
            )
        ],
    )


def material(serial: str = "s1", key_pem: bytes = KEY_PEM) -> SecretMaterial:
    """Secret material whose contents are not validated."""
    return SecretMaterial(
        cert_chain_pem=b"-----BEGIN CERTIFICATE-----\nCERT\n-----END CERTIFICATE-----\n",
        key_pem=key_pem,
        trust_bundle_pem=b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
        serial=serial,
    )


@dataclasses.dataclass
class FakeSources:
    """The catalog and certmanager behind a control plane: fetches answer from ``views`` and
    ``materials`` (else :func:`view` and :func:`material`), and every call is recorded."""

    views: dict[str, catalog_pb2.View] = dataclasses.field(default_factory=dict)
    materials: dict[str, SecretMaterial] = dataclasses.field(default_factory=dict)
    view_fetches: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    material_fetches: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    forgotten: list[str] = dataclasses.field(default_factory=list)
    refused: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    failure: Exception | None = None
    """Raised by the next fetch (then cleared), as a catalog that is down would."""

    async def fetch_inputs(self, identity: str, service_account: str) -> inputs.Inputs:
        """The identity's view from ``views`` (else :func:`view`), as a policy and slices."""
        self.view_fetches.append((identity, service_account))
        await asyncio.sleep(0)
        self._fail()
        return inputs.split(self.views.get(identity) or view(identity))

    async def fetch_material(self, identity: str, service_account: str) -> SecretMaterial:
        self.material_fetches.append((identity, service_account))
        await asyncio.sleep(0)
        self._fail()
        return self.materials.get(identity) or material()

    def _fail(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def forget(self, identity: str) -> None:
        self.forgotten.append(identity)

    def on_refused(self, key: str, problems: list[str]) -> None:
        self.refused.append((key, problems))

    def control_plane(self, cache: SnapshotCache) -> ProxyControlPlane:
        """A control plane over ``cache`` fed by these fakes."""
        return ProxyControlPlane(
            cache, self.fetch_inputs, self.fetch_material, self.forget, self.on_refused
        )


async def connect(
    control_plane: ProxyControlPlane,
    streams: StreamRegistry,
    common_name: str,
    *,
    settings: ProxySettings | None = None,
    protocol: str = "sotw",
    envoy_version: tuple[int, int, int] = (1, 40, 0),
) -> ProxyStream:
    """Attach a proxy as :class:`~trellis_proxy_cp.authorizer.MeshAuthorizer` does and add its
    stream to ``streams`` as the ADS server does; nothing is sent yet."""
    proxy = ProxyCommonName.parse(common_name)
    identity = f"{proxy.namespace}/{proxy.service}"
    key = await control_plane.attach(common_name, identity, proxy.service, settings or SIDECAR)
    major, minor, patch = envoy_version
    node = base_pb2.Node(id=common_name, cluster=proxy.service, user_agent_name="envoy")
    build = node.user_agent_build_version.version
    build.major_number, build.minor_number, build.patch = major, minor, patch
    stream = ProxyStream(
        proxy_id=common_name,
        key=key,
        node_id=common_name,
        identity=identity,
        envoy_version=envoy_version_of(node),
        protocol=protocol,
    )
    streams.add(stream)
    return stream


def acknowledge(stream: ProxyStream, current: Snapshot) -> None:
    """Record every type of ``current`` as sent to and ACKed by ``stream`` (a clean push)."""
    for type_url in current.type_urls():
        state = stream.state(type_url)
        state.sent_version = state.acked_version = current.version_of(type_url)
        state.nonce = "1"


def reject(stream: ProxyStream, type_url: TypeUrl, version: str, message: str) -> None:
    """Record that ``stream`` was sent ``version`` of ``type_url`` and NACKed it."""
    state = stream.state(type_url)
    state.sent_version = version
    state.nack_count += 1
    state.last_error = message


def broken_view(identity: str = "bookstore/bookstore", version: str = "1") -> catalog_pb2.View:
    """A view proxy-cp must refuse: it names the same cluster twice."""
    found = view(identity, version)
    found.clusters.append(found.clusters[0])
    return found


def peer_certificate_pem(
    common_name: str, serial: int, age: dt.timedelta = dt.timedelta(minutes=5)
) -> bytes:
    """A self-signed certificate for ``common_name`` with ``serial``, valid since ``age``
    ago: what gRPC puts in a peer's auth context as ``x509_pem_cert`` after an mTLS
    handshake (the handshake, not the authorizer, checks who signed it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(now - age)
        .not_valid_after(now + dt.timedelta(hours=1))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
