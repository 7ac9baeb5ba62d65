"""Component identities: join tokens, the policy table, renewal, and what the TLS tap sees."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from cryptography import x509

from trellis_api import catalog_pb2, certmanager_pb2, endpoints_pb2
from trellis_common import components
from trellis_identity import authz, jointoken
from trellis_identity.identity import ComponentIdentity, Issued
from trellis_runtime import tlstap
from trellis_testing.identities import LocalCA

# -- join tokens ---------------------------------------------------------------------------


def test_a_token_names_its_component_and_verifies_only_under_its_key() -> None:
    key = os.urandom(32)
    token = jointoken.mint(key, "catalog", ttl=60, now=1000.0)

    claim = jointoken.verify(key, token, now=1030.0)

    assert (claim.component, claim.expires_at) == ("catalog", 1060)
    with pytest.raises(jointoken.InvalidJoinToken, match="not made with this mesh's join key"):
        jointoken.verify(os.urandom(32), token, now=1030.0)
    with pytest.raises(jointoken.InvalidJoinToken, match="expired"):
        jointoken.verify(key, token, now=1061.0)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.replace("catalog", "proxy-cp"),  # another component, same MAC
        lambda t: t[:-2] + ("AA" if not t.endswith("AA") else "BB"),
        lambda t: "tjt1.catalog",
        lambda t: "eyJhbGciOiJSUzI1NiJ9.e30.sig",  # a JWT is not a join token
    ],
)
def test_a_changed_or_foreign_token_is_refused(change: object) -> None:
    key = os.urandom(32)
    token = change(jointoken.mint(key, "catalog"))  # type: ignore[operator]
    with pytest.raises(jointoken.InvalidJoinToken):
        jointoken.verify(key, token)


def test_tokens_for_what_is_not_a_component_are_not_made() -> None:
    with pytest.raises(components.UnknownComponent, match="'bookstore' is not a control plane"):
        jointoken.mint(os.urandom(32), "bookstore")


def test_the_token_file_is_private_and_taken_once(tmp_path: Path) -> None:
    path = jointoken.write_token(tmp_path, "injector")

    assert path == tmp_path / "join" / "injector"
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "join").stat().st_mode & 0o777 == 0o700
    assert jointoken.key_path(tmp_path).stat().st_mode & 0o777 == 0o600
    token = jointoken.take_token(path)
    key = jointoken.load_or_create_key(jointoken.key_path(tmp_path))
    assert jointoken.verify(key, token).component == "injector"
    assert not path.exists()


def test_a_join_key_others_can_read_is_refused(tmp_path: Path) -> None:
    path = jointoken.key_path(tmp_path)
    path.write_bytes(os.urandom(32))
    path.chmod(0o644)
    with pytest.raises(jointoken.InvalidJoinToken, match="chmod 600"):
        jointoken.load_or_create_key(path)
    path.chmod(0o600)
    path.write_bytes(b"short")
    with pytest.raises(jointoken.InvalidJoinToken, match="exactly 32 bytes, has 5"):
        jointoken.load_or_create_key(path)


# -- who a peer is -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "component"),
    [
        ("spiffe://cluster.local/ns/trellis-system/sa/proxy-cp", "proxy-cp"),
        ("spiffe://other.domain/ns/trellis-system/sa/proxy-cp", None),  # another mesh
        ("spiffe://cluster.local/ns/bookstore/sa/proxy-cp", None),  # a workload's
        ("spiffe://cluster.local/ns/trellis-system/sa/bookstore", None),  # not a component
        ("", None),
        ("https://cluster.local/ns/trellis-system/sa/catalog", None),
    ],
)
def test_only_a_control_plane_spiffe_id_of_the_trust_domain_is_a_component(
    uri: str, component: str | None
) -> None:
    assert components.component_of(uri, "cluster.local") == component


# -- the policy table ------------------------------------------------------------------------


def test_every_rpc_of_the_internal_apis_has_a_cell() -> None:
    methods = {
        f"/{service.full_name}/{method.name}"
        for module in (certmanager_pb2, catalog_pb2, endpoints_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    cells = {cell.split("[")[0] for cell in authz.POLICY}
    assert methods - cells == set()
    for cell, allowed in authz.POLICY.items():
        assert allowed <= set(components.COMPONENTS), cell


def test_issuing_is_three_powers_chosen_by_the_request() -> None:
    method = "/trellis.certmanager.v1.CertificateManager/IssueCertificate"
    proxy = certmanager_pb2.IssueCertificateRequest(kind=certmanager_pb2.CERTIFICATE_KIND_PROXY)
    service = certmanager_pb2.IssueCertificateRequest(kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE)
    info = certmanager_pb2.IssueCertificateRequest(
        kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE, omit_private_key=True
    )

    assert [authz.cell(method, r) for r in (proxy, service, info)] == [
        method + "[proxy]",
        method + "[service]",
        method + "[service-info]",
    ]
    assert authz.allowed(method + "[proxy]", "injector")
    assert not authz.allowed(method + "[proxy]", "catalog")
    # a service's key: nobody's (every proxy has its own workload certificate)
    assert not any(authz.allowed(method + "[service]", c) for c in components.COMPONENTS)
    assert authz.allowed(method + "[service-info]", "catalog")
    assert not authz.allowed(method, "injector")  # the bare method is no cell: refused
    assert not authz.allowed(method + "[proxy]", None)


# -- renewal ---------------------------------------------------------------------------------


async def test_renewal_swaps_the_material_and_tells_the_listeners() -> None:
    ca = LocalCA()
    csrs: list[bytes] = []

    async def renew(csr_pem: bytes) -> Issued:
        csrs.append(csr_pem)
        return ca.sign_csr("catalog", csr_pem)

    first = ca.identity("catalog").material
    identity = ComponentIdentity("catalog", first, renew)
    told: list[int] = []
    identity.on_renewed(lambda: told.append(identity.generation))
    context = identity.server_ssl_context()

    await identity.renew()

    assert identity.material.leaf.serial_number != first.leaf.serial_number
    assert told == [2]
    request = x509.load_pem_x509_csr(csrs[0])
    assert request.is_signature_valid
    assert context.cert_store_stats() is not None  # reloaded in place (no exception)


async def test_a_renewal_for_another_key_is_refused() -> None:
    ca = LocalCA()
    other = ca.identity("catalog").material  # right identity, but not the CSR's key

    async def renew(csr_pem: bytes) -> Issued:
        return Issued(other.cert_chain_pem, other.trust_bundle_pem)

    identity = ComponentIdentity("catalog", ca.identity("catalog").material, renew)
    with pytest.raises(ValueError, match="another key than the CSR's"):
        await identity.renew()
    assert identity.generation == 1


async def test_a_renewal_for_another_identity_is_refused() -> None:
    ca = LocalCA()

    async def renew(csr_pem: bytes) -> Issued:
        return ca.sign_csr("proxy-cp", csr_pem)

    identity = ComponentIdentity("catalog", ca.identity("catalog").material, renew)
    with pytest.raises(ValueError, match="proxy-cp"):
        await identity.renew()
    assert identity.generation == 1


async def test_the_renewal_loop_renews_at_two_thirds_of_the_lifetime() -> None:
    ca = LocalCA()
    renewed = asyncio.Event()

    async def renew(csr_pem: bytes) -> Issued:
        renewed.set()
        return ca.sign_csr("catalog", csr_pem)

    identity = ComponentIdentity("catalog", ca.identity("catalog", expired=True).material, renew)
    stop = asyncio.Event()
    running = asyncio.create_task(identity.run(stop))
    await asyncio.wait_for(renewed.wait(), timeout=5)  # past its renewal point: at once
    stop.set()
    await asyncio.wait_for(running, timeout=5)
    assert identity.material.leaf.not_valid_after_utc > identity.material.renew_at


# -- the TLS tap ------------------------------------------------------------------------------

# Lines gRPC 1.7x wrote when a client came without a certificate, with an expired one, and
# with one of a foreign CA of another name, and of the same name.
LINES = [
    (
        b"I1123 19:54:41.114346   14321 ssl_transport_security.cc:2563] Handshake failed with "
        b"error SSL_ERROR_SSL: error:100000c0:SSL routines:OPENSSL_internal:"
        b"PEER_DID_NOT_RETURN_A_CERTIFICATE: Invalid certificate verification context",
        "no_certificate",
    ),
    (
        b"I1123 19:54:41.120076   14321 ssl_transport_security.cc:2563] Handshake failed with "
        b"error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        b"CERTIFICATE_VERIFY_FAILED: certificate has expired",
        "expired",
    ),
    (
        b"I1123 19:54:41.123633   14322 ssl_transport_security.cc:2563] Handshake failed with "
        b"error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:"
        b"CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate",
        "unknown_ca",
    ),
    (
        b"I1123 20:12:37.805909   25406 ssl_transport_security.cc:2563] Handshake failed with "
        b"error SSL_ERROR_SSL: error:1a000064:ECDSA routines:OPENSSL_internal:BAD_SIGNATURE: "
        b"certificate signature failure",
        "unknown_ca",
    ),
    (b"ts=2026-11-23T20:12:31Z level=info logger=x grpc.listening tls=True", None),
]


@pytest.mark.parametrize(("line", "reason"), LINES)
def test_the_tap_knows_why_a_handshake_failed(line: bytes, reason: str | None) -> None:
    assert tlstap.reason_of(line) == reason


def test_the_tap_counts_and_replaces_handshake_lines_and_passes_the_rest() -> None:
    tap = tlstap.HandshakeTap()
    kept = [line for line, _ in LINES if tap._keep(line)]
    assert kept == [LINES[-1][0]]
    assert not tap._keep(b"W0000 log.cc:102] Log level INFO is not suitable for production.")
    assert dict(tap.counts) == {"no_certificate": 1, "expired": 1, "unknown_ca": 2}
    samples = {s.labels["reason"]: s.value for m in tap.collect() for s in m.samples}
    assert samples == {"expired": 1.0, "no_certificate": 1.0, "unknown_ca": 2.0}
