"""A component checks the SPIFFE id of the server it calls: real grpc.aio servers, each
presenting a certificate of the mesh CA, some of them an impostor's."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from trellis_common import components
from trellis_identity import servercheck, tls
from trellis_identity.identity import ComponentIdentity, Material
from trellis_runtime.grpcserver import GrpcServer
from trellis_testing.identities import LocalCA

CERTMANAGER_URI = "spiffe://cluster.local/ns/trellis-system/sa/certmanager"
CATALOG_URI = "spiffe://cluster.local/ns/trellis-system/sa/catalog"


def names_of(component: str) -> list[x509.GeneralName]:
    return [x509.DNSName(n) for n in components.dns_names(component, "cluster.local")]


@asynccontextmanager
async def serving(material: Material, port: int = 0) -> AsyncIterator[int]:
    """A health-only mTLS server presenting ``material``; yields its port."""
    credentials = tls.dynamic_server_credentials(lambda: material, require_client_auth=True)
    server = GrpcServer(f"127.0.0.1:{port}", [], [], credentials=credentials, grace=0.1)
    bound = await server.start()
    try:
        yield bound
    finally:
        await server.server.stop(None)


async def check_health(channel: grpc.aio.Channel) -> None:
    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)


async def first_refusal(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
    """Call until the server check refuses a call (once the channel has seen its old
    connection go: a call on it meanwhile may fail as gRPC fails it); that refusal."""
    for _ in range(50):
        try:
            await check_health(channel)
        except grpc.aio.AioRpcError as exc:
            if " refused: " in (exc.details() or ""):
                return exc
        await asyncio.sleep(0.1)
    raise AssertionError("no call was refused by the check")


def refusals(registry: CollectorRegistry, component: str, reason: str) -> float:
    value = registry.get_sample_value(
        "trellis_grpc_server_refusals_total", {"component": component, "reason": reason}
    )
    return value or 0.0


@pytest.fixture
def ca() -> LocalCA:
    return LocalCA()


@pytest.fixture
def caller(ca: LocalCA) -> tuple[ComponentIdentity, CollectorRegistry]:
    identity = ca.identity("catalog")
    registry = CollectorRegistry()
    identity.server_check.count_in(registry)
    return identity, registry


async def test_the_component_called_is_accepted(
    ca: LocalCA, caller: tuple[ComponentIdentity, CollectorRegistry]
) -> None:
    identity, registry = caller
    async with (
        serving(ca.identity("certmanager").material) as port,
        identity.channel(f"127.0.0.1:{port}", "certmanager") as channel,
    ):
        await check_health(channel)
        await check_health(channel)
    assert registry.get_sample_value("trellis_grpc_server_refusals_total") is None


async def test_a_certificate_naming_the_component_with_another_spiffe_id_is_refused(
    ca: LocalCA,
    caller: tuple[ComponentIdentity, CollectorRegistry],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The attack the DNS name alone lets through: a certificate of the mesh's trust bundle
    that names certmanager.trellis-system.svc but is the catalog's identity (what a service
    certificate in trellis-system, or an operator root that signs for more, would be)."""
    identity, registry = caller
    impostor = ca.issue(
        "certmanager.trellis-system",
        [*names_of("certmanager"), x509.UniformResourceIdentifier(CATALOG_URI)],
    )
    async with serving(impostor) as port:
        address = f"127.0.0.1:{port}"
        # gRPC's own check (the name) lets it through...
        plain = grpc.ssl_channel_credentials(
            ca.bundle_pem, identity.material.key_pem, identity.material.cert_chain_pem
        )
        override = [("grpc.ssl_target_name_override", components.server_name("certmanager"))]
        async with grpc.aio.secure_channel(address, plain, options=override) as channel:
            await check_health(channel)
        # ...a component's channel does not
        with caplog.at_level(logging.WARNING, "trellis_identity.servercheck"):
            async with identity.channel(address, "certmanager") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await check_health(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert f"presented {CATALOG_URI}, not {CERTMANAGER_URI}" in (caught.value.details() or "")
    assert refusals(registry, "certmanager", "wrong_identity") == 1.0
    assert (
        f"grpc.server_refused component=certmanager address={address} reason=wrong_identity "
        f"presented={CATALOG_URI}"
    ) in caplog.text


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda ca: ca.identity("catalog").material, "unverified"),  # another component
        (lambda ca: LocalCA().identity("certmanager").material, "unverified"),  # another CA
        (lambda ca: ca.issue("certmanager", names_of("certmanager")), "no_spiffe_id"),
    ],
    ids=["another-component", "another-ca", "no-spiffe-id"],
)
async def test_other_certificates_are_refused_by_reason(
    ca: LocalCA,
    caller: tuple[ComponentIdentity, CollectorRegistry],
    make: Callable[[LocalCA], Material],
    reason: str,
) -> None:
    identity, registry = caller
    async with (
        serving(make(ca)) as port,
        identity.channel(f"127.0.0.1:{port}", "certmanager") as channel,
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check_health(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert refusals(registry, "certmanager", reason) == 1.0


async def test_a_server_swapped_while_the_channel_was_away_is_checked_again(
    ca: LocalCA, caller: tuple[ComponentIdentity, CollectorRegistry]
) -> None:
    identity, registry = caller
    impostor = ca.issue(
        "certmanager.trellis-system",
        [*names_of("certmanager"), x509.UniformResourceIdentifier(CATALOG_URI)],
    )
    async with serving(ca.identity("certmanager").material) as port:
        channel = identity.channel(f"127.0.0.1:{port}", "certmanager")
        await check_health(channel)
    try:
        async with serving(impostor, port):  # the same address, another server
            refused = await first_refusal(channel)
    finally:
        await channel.close()
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert refusals(registry, "certmanager", "wrong_identity") == 1.0


async def test_nobody_there_is_unavailable_and_no_refusal(
    caller: tuple[ComponentIdentity, CollectorRegistry],
) -> None:
    identity, registry = caller
    async with serving(LocalCA().identity("certmanager").material) as port:
        pass  # a port nobody listens on any more
    async with identity.channel(f"127.0.0.1:{port}", "certmanager") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check_health(channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert registry.get_sample_value("trellis_grpc_server_refusals_total") is None


async def test_the_blocking_check_reads_the_served_certificate(ca: LocalCA) -> None:
    client = ca.identity("catalog").material
    async with serving(ca.identity("proxy-cp").material) as port:
        address = f"127.0.0.1:{port}"
        served = await asyncio.to_thread(
            servercheck.verify_server,
            address,
            "proxy-cp.trellis-system.svc",
            "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp",
            ca.bundle_pem,
            client.cert_chain_pem,
            client.key_pem,
        )
        assert servercheck.spiffe_ids(served) == [
            "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
        ]
        with pytest.raises(servercheck.ServerRefused) as refused:
            await asyncio.to_thread(
                servercheck.verify_server,
                address,
                "proxy-cp.trellis-system.svc",
                CERTMANAGER_URI,
                ca.bundle_pem,
                client.cert_chain_pem,
                client.key_pem,
            )
    assert refused.value.reason == "wrong_identity"


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:15020", ("127.0.0.1", 15020)),
        ("[::1]:15020", ("::1", 15020)),
        ("dns:///certmanager.trellis-system.svc:15020", ("certmanager.trellis-system.svc", 15020)),
    ],
)
def test_targets(address: str, expected: tuple[str, int]) -> None:
    assert servercheck.target(address) == expected


@pytest.mark.parametrize("address", ["unix:/tmp/socket", "certmanager", ":15020"])
def test_what_is_no_host_and_port_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="not host:port"):
        servercheck.target(address)
