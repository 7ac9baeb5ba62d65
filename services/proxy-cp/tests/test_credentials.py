"""proxy-cp's serving credentials: mTLS on a real grpc.aio server, a renewal without a restart,
and the client certificate's common name reaching the authorizer.

proxy-cp serves every port with its component certificate
(``ComponentIdentity.server_credentials``, over ``tls.dynamic_server_credentials``); here a
:class:`Serving` holder stands for the identity, whose material a renewal replaces."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trellis_identity import tls
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.authorizer import MeshAuthorizer, end_revoked
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.transport.ads import AdsServicer
from trellis_proxy_cp.types import CLUSTER
from trellis_runtime.grpcserver import GrpcServer

PROXY = t.proxy_common_name("bookstore", "bookstore", 1)
OK = grpc.StatusCode.OK
REFUSED = grpc.StatusCode.UNAVAILABLE  # the handshake fails


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


class CA:
    """A throwaway mesh CA."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.pem = (
            self._builder(self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
            .public_bytes(serialization.Encoding.PEM)
        )

    def _builder(
        self, subject: x509.Name, key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
        )

    def issue(self, common_name: str, *, server: bool = False) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            self._builder(
                x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]),
                key.public_key(),
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return Issued(
            builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def serving(self, serial: str) -> SecretMaterial:
        """proxy-cp's own certificate and key, with this CA as the trust bundle."""
        issued = self.issue("proxy-cp", server=True)
        return SecretMaterial(issued.cert_pem, issued.key_pem, self.pem, serial)

    def client(self, common_name: str = PROXY) -> grpc.ChannelCredentials:
        issued = self.issue(common_name)
        return tls.channel_credentials(self.pem, issued.cert_pem, issued.key_pem)


class Serving:
    """proxy-cp's certificate as its identity holds it: a renewal replaces the material."""

    def __init__(self, material: SecretMaterial) -> None:
        self.material = material

    def update(self, material: SecretMaterial) -> None:
        self.material = material

    def credentials(self, clients: bool = True) -> grpc.ServerCredentials:
        return tls.dynamic_server_credentials(lambda: self.material, require_client_auth=clients)


@pytest.fixture(scope="module")
def mesh_ca() -> CA:
    return CA("trellis mesh root")


# -- a real server -------------------------------------------------------------------------


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Serving], Awaitable[int]]]:
    """Start a health-only grpc.aio server with ``credentials()``; returns its port."""
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def start(serving: Serving) -> int:
        server = GrpcServer("127.0.0.1:0", [], [], credentials=serving.credentials(), grace=0.1)
        port = await server.start()
        tasks.append(asyncio.create_task(server.run(stop)))
        return port

    yield start
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)


async def health(port: int, credentials: grpc.ChannelCredentials) -> grpc.StatusCode:
    """The status of a health check over a new connection with ``credentials``."""
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_a_client_with_a_mesh_certificate_gets_in_one_without_does_not(
    mesh_ca: CA, serve: Callable[[Serving], Awaitable[int]]
) -> None:
    port = await serve(Serving(mesh_ca.serving("s1")))

    assert await health(port, mesh_ca.client()) == OK
    assert await health(port, tls.channel_credentials(mesh_ca.pem)) == REFUSED
    assert await health(port, CA("somebody else's root").client()) == REFUSED


async def test_a_rotation_applies_to_the_next_handshake_without_a_restart(
    mesh_ca: CA, serve: Callable[[Serving], Awaitable[int]]
) -> None:
    serving = Serving(mesh_ca.serving("s1"))
    port = await serve(serving)
    new_ca = CA("trellis mesh root, rotated")

    serving.update(new_ca.serving("s2"))

    assert await health(port, new_ca.client()) == OK
    assert await health(port, mesh_ca.client()) == REFUSED  # neither trusted nor trusting any more


async def test_each_port_gets_the_renewal(
    mesh_ca: CA, serve: Callable[[Serving], Awaitable[int]]
) -> None:
    """One port's handshake does not hide a renewal from another (each has its own)."""
    serving = Serving(mesh_ca.serving("s1"))
    xds, destination = await serve(serving), await serve(serving)
    assert await health(xds, mesh_ca.client()) == OK
    new_ca = CA("trellis mesh root, renewed")

    serving.update(new_ca.serving("s2"))

    assert await health(xds, new_ca.client()) == OK
    assert await health(destination, new_ca.client()) == OK
    assert await health(destination, mesh_ca.client()) == REFUSED


async def test_the_client_certificates_common_name_reaches_the_authorizer(
    mesh_ca: CA, serve: Callable[[Serving], Awaitable[int]]
) -> None:
    sources = t.FakeSources()
    cache = SnapshotCache()

    async def expected(
        common_name: str, serial: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        return Expectation("bookstore") if common_name == PROXY else None

    servicer = AdsServicer(cache, MeshAuthorizer(sources.control_plane(cache), expected))
    server = grpc.aio.server()
    servicer.register(server)
    port = server.add_secure_port("127.0.0.1:0", Serving(mesh_ca.serving("s1")).credentials())
    await server.start()
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", mesh_ca.client()) as channel:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            await call.write(discovery_pb2.DiscoveryRequest(node=t.node(PROXY), type_url=CLUSTER))
            response = await asyncio.wait_for(call.read(), t.TIMEOUT)
            assert response.type_url == CLUSTER
            assert len(response.resources) == 2  # the upstream and the inbound cluster
            call.cancel()
        async with grpc.aio.secure_channel(
            f"127.0.0.1:{port}", mesh_ca.client(t.proxy_common_name("x", "y", 7))
        ) as channel:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            await call.write(discovery_pb2.DiscoveryRequest(node=t.node(PROXY), type_url=CLUSTER))
            assert await asyncio.wait_for(call.code(), t.TIMEOUT) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
    finally:
        await server.stop(None)
        for _ in range(3):  # let grpc's per-RPC tasks see their handlers end
            await asyncio.sleep(0)
    assert sources.view_fetches == [("bookstore/bookstore", "bookstore")]


async def test_a_revoked_serial_ends_its_open_stream_within_a_second_and_is_refused_after(
    mesh_ca: CA,
) -> None:
    """The serial comes from the certificate presented in the real TLS handshake."""
    sources = t.FakeSources()
    cache = SnapshotCache()
    hooks = t.RecordingHooks()
    issued = mesh_ca.issue(PROXY)
    serial = f"{x509.load_pem_x509_certificate(issued.cert_pem).serial_number:x}"
    credentials = tls.channel_credentials(mesh_ca.pem, issued.cert_pem, issued.key_pem)

    async def expected(
        common_name: str, presented: str = "", *, onboarding: bool = False
    ) -> Expectation | None:
        assert presented == serial  # what the handshake presented
        return Expectation("bookstore", serial) if common_name == PROXY else None

    revoked = RevokedSerials()
    authorizer = MeshAuthorizer(sources.control_plane(cache), expected, revoked)
    servicer = AdsServicer(cache, authorizer, hooks)
    server = grpc.aio.server()
    servicer.register(server)
    port = server.add_secure_port("127.0.0.1:0", Serving(mesh_ca.serving("s1")).credentials())
    await server.start()
    try:
        async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            call = stub.StreamAggregatedResources()
            await call.write(discovery_pb2.DiscoveryRequest(node=t.node(PROXY), type_url=CLUSTER))
            await asyncio.wait_for(call.read(), t.TIMEOUT)
            [stream] = servicer.registry.of_proxy(PROXY)
            assert stream.serial == serial

            revoked.add(PROXY, [serial])
            assert end_revoked(servicer.runner, PROXY, {serial}) == 1
            code = await asyncio.wait_for(call.code(), 1.0)
            assert code == grpc.StatusCode.PERMISSION_DENIED
            assert "was revoked" in (await call.details() or "")

            again = stub.StreamAggregatedResources()
            await again.write(discovery_pb2.DiscoveryRequest(node=t.node(PROXY), type_url=CLUSTER))
            assert await asyncio.wait_for(again.code(), t.TIMEOUT) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
            assert f"(serial {serial}) is revoked" in (await again.details() or "")
    finally:
        await server.stop(None)
        for _ in range(3):  # let grpc's per-RPC tasks see their handlers end
            await asyncio.sleep(0)
    assert [c[1:] for c in hooks.calls if c[0] == "refused"] == [
        (PROXY, "sotw", "PERMISSION_DENIED", "revoked"),
        (PROXY, "sotw", "PERMISSION_DENIED", "revoked"),
    ]
