"""mTLS credentials over a real gRPC server: who gets in, who does not."""

import asyncio
import datetime as dt
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from trellis_identity import tls
from trellis_runtime.grpcserver import GrpcServer

TARGET_OVERRIDE = (("grpc.ssl_target_name_override", "localhost"),)


@dataclass(frozen=True)
class Issued:
    cert_pem: bytes
    key_pem: bytes


class CA:
    """A throwaway certificate authority."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, *, server: bool) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


@dataclass(frozen=True)
class Pki:
    ca: CA
    server: Issued
    client: Issued
    stranger: Issued  # a client certificate from another CA
    other_ca: CA


@pytest.fixture(scope="module")
def pki() -> Pki:
    ca = CA("trellis test root")
    other = CA("somebody else's root")
    return Pki(
        ca=ca,
        server=ca.issue("proxy-cp", server=True),
        client=ca.issue("proxy-1", server=False),
        stranger=other.issue("proxy-1", server=False),
        other_ca=other,
    )


@pytest.fixture
async def mtls_port(pki: Pki) -> AsyncIterator[int]:
    credentials = tls.server_credentials(
        pki.server.cert_pem, pki.server.key_pem, pki.ca.pem, require_client_auth=True
    )
    server = GrpcServer("127.0.0.1:0", [], ["some.Service"], credentials=credentials, grace=0.1)
    stop = asyncio.Event()
    port = await server.start()
    task = asyncio.create_task(server.run(stop))
    yield port
    stop.set()
    await asyncio.wait_for(task, 5)


async def health_check(port: int, credentials: grpc.ChannelCredentials) -> int:
    async with grpc.aio.secure_channel(
        f"127.0.0.1:{port}", credentials, options=TARGET_OVERRIDE
    ) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="some.Service"), timeout=5
        )
    status: int = response.status
    return status


async def test_a_client_with_a_mesh_certificate_gets_in(pki: Pki, mtls_port: int) -> None:
    credentials = tls.channel_credentials(pki.ca.pem, pki.client.cert_pem, pki.client.key_pem)

    assert await health_check(mtls_port, credentials) == health_pb2.HealthCheckResponse.SERVING


async def test_the_server_is_verified_by_its_ip_san_too(pki: Pki, mtls_port: int) -> None:
    credentials = tls.channel_credentials(pki.ca.pem, pki.client.cert_pem, pki.client.key_pem)

    async with grpc.aio.secure_channel(f"127.0.0.1:{mtls_port}", credentials) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=5
        )

    assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_client_without_a_certificate_is_refused(pki: Pki, mtls_port: int) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await health_check(mtls_port, tls.channel_credentials(pki.ca.pem))

    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_certificate_from_another_ca_is_refused(pki: Pki, mtls_port: int) -> None:
    credentials = tls.channel_credentials(pki.ca.pem, pki.stranger.cert_pem, pki.stranger.key_pem)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await health_check(mtls_port, credentials)

    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_does_not_trust_the_server_ca_gives_up(
    pki: Pki, mtls_port: int
) -> None:
    credentials = tls.channel_credentials(pki.other_ca.pem, pki.client.cert_pem, pki.client.key_pem)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await health_check(mtls_port, credentials)

    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_server_tls_without_client_auth_accepts_anonymous_clients(pki: Pki) -> None:
    credentials = tls.server_credentials(
        pki.server.cert_pem, pki.server.key_pem, None, require_client_auth=False
    )
    server = GrpcServer("127.0.0.1:0", [], ["some.Service"], credentials=credentials, grace=0.1)
    stop = asyncio.Event()
    port = await server.start()
    task = asyncio.create_task(server.run(stop))
    try:
        status = await health_check(port, tls.channel_credentials(pki.ca.pem))
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)

    assert status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("client_ca", [None, b""])
def test_client_auth_needs_a_client_ca(pki: Pki, client_ca: bytes | None) -> None:
    with pytest.raises(ValueError, match="require_client_auth needs client_ca_pem"):
        tls.server_credentials(
            pki.server.cert_pem, pki.server.key_pem, client_ca, require_client_auth=True
        )


def test_a_client_certificate_needs_its_key(pki: Pki) -> None:
    with pytest.raises(ValueError, match="go together"):
        tls.channel_credentials(pki.ca.pem, pki.client.cert_pem)
    with pytest.raises(ValueError, match="go together"):
        tls.channel_credentials(pki.ca.pem, None, pki.client.key_pem)
