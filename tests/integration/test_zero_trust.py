"""Zero trust inside the control plane: every internal call authenticated and authorized.

certmanager (with an operator CA the test holds, so it can also make the certificates an
attacker would bring), endpoints-vm and the catalog run as processes beside a real Redis,
each with the identity it joined with. Each test is one attack; each asserts the refusal,
and that the refused service logged and counted it. The first test walks the whole policy
table: every cell, called by every component, is refused exactly where the table says.

The attacks only knock: none changes what the control plane holds (a refused call issues,
stores and registers nothing, and the tests check that too), so they share one control plane
(``shared``) on one xdist worker, and each counts what it caused from what the counters and
logs held before it.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from trellis_api import (
    catalog_pb2,
    catalog_pb2_grpc,
    certmanager_pb2,
    certmanager_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
)
from trellis_common import components
from trellis_identity import authz, jointoken
from trellis_identity.identity import ComponentIdentity, csr_for, new_key
from trellis_testing import RedisServer, redis_backend
from trellis_testing.identities import LocalCA, join_as
from trellis_testing.services import ServiceProcess, running
from trellis_testing.waiting import eventually

PROXY_CSR = csr_for(new_key()[1], "a proxy")  # a proxy made its key; certmanager signs it

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("zero-trust-shared")]

CM = "/trellis.certmanager.v1.CertificateManager/"
CATALOG = "/trellis.catalog.v1.Catalog/"
PROVIDER = "/trellis.endpoints.v1.EndpointsProvider/"
HEALTH = "/grpc.health.v1.Health/"


@pytest.fixture(scope="module")
def shared(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[dict[str, ServiceProcess], LocalCA, Path]]:
    """One control plane for every test of the module (they only knock on it): its
    processes, the operator CA, and its state directory (where the join key lies)."""
    tmp = tmp_path_factory.mktemp("zero-trust")
    state_dir = tmp / "state"
    state_dir.mkdir()
    ca = LocalCA()
    with redis_backend.redis_server(tmp / "redis") as redis:
        processes = control_plane(state_dir, redis, ca, tmp)
        with running(processes):
            yield processes, ca, state_dir


@pytest.fixture
def services(
    shared: tuple[dict[str, ServiceProcess], LocalCA, Path],
) -> dict[str, ServiceProcess]:
    return shared[0]


@pytest.fixture
def ca(shared: tuple[dict[str, ServiceProcess], LocalCA, Path]) -> LocalCA:
    return shared[1]


@pytest.fixture
def state_dir(shared: tuple[dict[str, ServiceProcess], LocalCA, Path]) -> Path:
    """The shared control plane's state directory (overrides the conftest's fresh one)."""
    return shared[2]


def control_plane(
    state_dir: Path, redis_server: RedisServer, ca: LocalCA, tmp_path: Path
) -> dict[str, ServiceProcess]:
    """certmanager on the operator CA ``ca``, endpoints-vm and the catalog (not started)."""
    cert, key = tmp_path / "ca.pem", tmp_path / "ca-key.pem"
    cert.write_bytes(ca.bundle_pem)
    key.write_bytes(
        ca.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key.chmod(0o600)
    return {
        "certmanager": ServiceProcess(
            "certmanager",
            "trellis_certmanager.main",
            state_dir,
            redis_server.url,
            args=("--ca-cert-file", str(cert), "--ca-key-file", str(key)),
        ),
        "endpoints-vm": ServiceProcess(
            "endpoints-vm", "trellis_endpoints_vm.main", state_dir, redis_server.url
        ),
        "catalog": ServiceProcess("catalog", "trellis_catalog.main", state_dir, redis_server.url),
    }


# -- every cell of the policy ------------------------------------------------------------

_SHOP = certmanager_pb2.MeshService(namespace="shop", name="cart")
_CN = "00000000-0000-4000-8000-000000000001.cart.shop"


def _first(stream: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """A server-streaming RPC (a watch) called as a unary one: its first answer, or its
    error (a refusal comes before any answer)."""

    async def unary(request: Any, timeout: float) -> Any:
        call = stream(request, timeout=timeout)
        try:
            return await call.read()
        finally:
            call.cancel()

    return unary


def _cm(method: str, request: Any) -> tuple[str, Callable[[grpc.aio.Channel], Any], Any]:
    return (
        "certmanager",
        lambda ch: getattr(certmanager_pb2_grpc.CertificateManagerStub(ch), method),
        request,
    )


#: cell -> (service, stub method of a channel, a request). Requests are small, valid in
#: shape where the cell depends on them, and need nothing to exist: an allowed call may
#: answer NOT_FOUND or INVALID_ARGUMENT, never PERMISSION_DENIED.
CALLS: dict[str, tuple[str, Callable[[grpc.aio.Channel], Any], Any]] = {
    CM + "IssueCertificate[proxy]": _cm(
        "IssueCertificate",
        certmanager_pb2.IssueCertificateRequest(
            kind=certmanager_pb2.CERTIFICATE_KIND_PROXY,
            service=_SHOP,
            service_account="Bad!",
            csr_pem=PROXY_CSR,
        ),
    ),
    CM + "IssueCertificate[service]": _cm(
        "IssueCertificate",
        certmanager_pb2.IssueCertificateRequest(
            kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE, service=_SHOP, service_account="Bad!"
        ),
    ),
    CM + "IssueCertificate[service-info]": _cm(
        "IssueCertificate",
        certmanager_pb2.IssueCertificateRequest(
            kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE,
            service=_SHOP,
            service_account="Bad!",
            omit_private_key=True,
        ),
    ),
    CM + "GetCertificate": _cm(
        "GetCertificate", certmanager_pb2.GetCertificateRequest(common_name="x")
    ),
    CM + "RotateCertificate": _cm(
        "RotateCertificate", certmanager_pb2.RotateCertificateRequest(common_name="x")
    ),
    CM + "GetRoot": _cm("GetRoot", certmanager_pb2.GetRootRequest()),
    CM + "ListCertificates": _cm("ListCertificates", certmanager_pb2.ListCertificatesRequest()),
    CM + "GetCertificateInfo": _cm(
        "GetCertificateInfo", certmanager_pb2.GetCertificateRequest(common_name="x")
    ),
    CM + "ListRevokedCertificates": _cm(
        "ListRevokedCertificates", certmanager_pb2.ListRevokedCertificatesRequest()
    ),
    CM + "RenewComponentCertificate": _cm(
        "RenewComponentCertificate", certmanager_pb2.RenewComponentCertificateRequest()
    ),
    CM + "RenewProxyCertificate": _cm(
        "RenewProxyCertificate", certmanager_pb2.RenewProxyCertificateRequest()
    ),
    CM + "ListRevokedComponentCertificates": _cm(
        "ListRevokedComponentCertificates",
        certmanager_pb2.ListRevokedComponentCertificatesRequest(),
    ),
    # no Kubernetes API here: an allowed call is FAILED_PRECONDITION (no_kubernetes)
    CM + "EnrollProxy": _cm("EnrollProxy", certmanager_pb2.EnrollProxyRequest()),
    **{
        CATALOG + name: (
            "catalog",
            (lambda n: lambda ch: getattr(catalog_pb2_grpc.CatalogStub(ch), n))(name),
            request,
        )
        for name, request in [
            ("GetView", catalog_pb2.GetViewRequest()),
            ("ListChanges", catalog_pb2.ListChangesRequest()),
            ("GetResources", catalog_pb2.GetResourcesRequest()),
            ("ListServices", catalog_pb2.ListServicesRequest()),
            ("CheckPolicy", catalog_pb2.CheckPolicyRequest()),
            ("ExpectProxy", catalog_pb2.ExpectProxyRequest(common_name="bad")),
            ("RegisterProxy", catalog_pb2.RegisterProxyRequest()),
            ("UnregisterProxy", catalog_pb2.UnregisterProxyRequest()),
            ("ListProxies", catalog_pb2.ListProxiesRequest()),
            ("GetSidecarSettings", catalog_pb2.GetSidecarSettingsRequest()),
        ]
    },
    CATALOG + "WatchChanges": (
        "catalog",
        lambda ch: _first(catalog_pb2_grpc.CatalogStub(ch).WatchChanges),
        catalog_pb2.ListChangesRequest(),
    ),
    PROVIDER + "WatchServices": (
        "endpoints-vm",
        lambda ch: _first(endpoints_pb2_grpc.EndpointsProviderStub(ch).WatchServices),
        endpoints_pb2.ListServicesRequest(),
    ),
    **{
        PROVIDER + name: (
            "endpoints-vm",
            (lambda n: lambda ch: getattr(endpoints_pb2_grpc.EndpointsProviderStub(ch), n))(name),
            request,
        )
        for name, request in [
            ("ListServices", endpoints_pb2.ListServicesRequest()),
            ("GetService", endpoints_pb2.GetServiceRequest()),
        ]
    },
}


def test_the_calls_cover_every_unary_cell_of_the_policy() -> None:
    streaming = {HEALTH + "Watch", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}
    assert set(CALLS) | streaming | {HEALTH + "Check"} == set(authz.POLICY)


async def call(
    identity: ComponentIdentity,
    process: ServiceProcess,
    method: Callable[[grpc.aio.Channel], Any],
    request: Any,
) -> grpc.StatusCode:
    async with identity.channel(process.endpoint.grpc_address, process.name) as channel:
        try:
            await method(channel)(request, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def since(
    before: dict[tuple[str, str, str], float], now: dict[tuple[str, str, str], float]
) -> dict[tuple[str, str, str], float]:
    """What each counter gained from ``before`` to ``now``."""
    return {key: value - before.get(key, 0.0) for key, value in now.items()}


def sample(metrics: str, series: str) -> float:
    """The value of one exact series (name and labels) in a /metrics text; 0 if absent."""
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def refusals(process: ServiceProcess) -> dict[tuple[str, str, str], float]:
    text = process.get("/metrics").text
    found = re.findall(
        r'trellis_grpc_refusals_total\{caller="([^"]*)",method="([^"]*)",reason="([^"]*)"\} (\S+)',
        text,
    )
    return {(method, who, reason): float(n) for who, method, reason, n in found}


async def test_every_cell_refuses_exactly_the_components_it_does_not_name(
    services: dict[str, ServiceProcess], state_dir: Path
) -> None:
    callers = {c: join_as(state_dir, c) for c in components.COMPONENTS if c != "certmanager"}
    before = refusals(services["certmanager"])
    logged = (
        services["certmanager"]
        .logs()
        .count("grpc.refused method=" + CM + "IssueCertificate[proxy]")
    )
    wrong: list[str] = []
    for cell, (service, method, request) in CALLS.items():
        for component, identity in callers.items():
            code = await call(identity, services[service], method, request)
            refused = code == grpc.StatusCode.PERMISSION_DENIED
            if refused == authz.allowed(cell, component):
                wrong.append(f"{component} -> {cell}: {code.name}")
        health = await call(
            callers["injector"],
            services[service],
            lambda ch: ch.unary_unary(
                HEALTH + "Check",
                request_serializer=lambda r: b"",
                response_deserializer=lambda b: b,
            ),
            None,
        )
        assert health == grpc.StatusCode.OK
    assert wrong == []
    # each refusal was counted under the method and the caller, with its reason
    counted = since(before, refusals(services["certmanager"]))
    assert counted[(CM + "GetCertificate", "catalog", "not_in_policy")] == 1.0
    assert counted[(CM + "IssueCertificate", "catalog", "not_in_policy")] == 2.0  # proxy, key
    assert (
        services["certmanager"]
        .logs()
        .count("grpc.refused method=" + CM + "IssueCertificate[proxy]")
        > logged
    )


# -- one test per attack --------------------------------------------------------------------


async def never_renewed(csr_pem: bytes) -> Any:
    raise AssertionError("a test identity is not renewed")


async def test_a_component_certificate_outside_its_cell_is_refused_logged_and_counted(
    services: dict[str, ServiceProcess], state_dir: Path
) -> None:
    certmanager = services["certmanager"]
    catalog = join_as(state_dir, "catalog")  # it may know certificates; no one gets a service key
    before = refusals(certmanager)
    logged = certmanager.logs().count("reason=not_in_policy")
    request = certmanager_pb2.IssueCertificateRequest(
        kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE, service=_SHOP
    )
    async with catalog.channel(certmanager.endpoint.grpc_address, "certmanager") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await certmanager_pb2_grpc.CertificateManagerStub(channel).IssueCertificate(request)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == (
        f"catalog may not call {CM}IssueCertificate[service] (allowed: no component)"
    )
    counted = since(before, refusals(certmanager))
    assert counted[(CM + "IssueCertificate", "catalog", "not_in_policy")] == 1.0
    assert certmanager.logs().count("reason=not_in_policy") == logged + 1
    assert certmanager.get("/v1/certificates").json()["certificates"] == []


async def test_a_proxy_certificate_of_the_mesh_ca_is_no_control_plane_identity(
    services: dict[str, ServiceProcess], ca: LocalCA
) -> None:
    catalog = services["catalog"]
    before = refusals(catalog)
    logged = catalog.logs()
    # what a proxy holds: the mesh CA's certificate, CN only (or a workload's SPIFFE id)
    for name, sans in [
        (_CN, []),
        (
            "bookstore",
            [x509.UniformResourceIdentifier("spiffe://cluster.local/ns/shop/sa/catalog")],
        ),
    ]:
        proxy = ComponentIdentity("catalog", ca.issue(name, sans), never_renewed)
        code = await call(
            proxy,
            catalog,
            lambda ch: catalog_pb2_grpc.CatalogStub(ch).ExpectProxy,
            catalog_pb2.ExpectProxyRequest(common_name=_CN, service_account="cart"),
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
    counted = since(before, refusals(catalog))
    assert counted[(CATALOG + "ExpectProxy", "-", "not_a_component")] == 2.0
    logs = catalog.logs()
    assert logs.count("reason=not_a_component") == logged.count("reason=not_a_component") + 2
    spiffe = "caller=spiffe://cluster.local/ns/shop/sa/catalog reason=not_a_component"
    assert logs.count(spiffe) == logged.count(spiffe) + 1
    assert catalog.get("/v1/proxies").json()["proxies"] == []


def handshake_failures(process: ServiceProcess) -> dict[str, float]:
    text = process.get("/metrics").text
    found = re.findall(r'trellis_tls_handshake_failures_total\{reason="([^"]+)"\} (\S+)', text)
    return {reason: float(n) for reason, n in found}


@pytest.mark.parametrize(
    ("who", "reason"),
    [("no certificate", "no_certificate"), ("foreign CA", "unknown_ca"), ("expired", "expired")],
)
async def test_a_caller_without_a_valid_mesh_certificate_never_gets_past_tls(
    services: dict[str, ServiceProcess], ca: LocalCA, who: str, reason: str
) -> None:
    certmanager = services["certmanager"]
    before = handshake_failures(certmanager).get(reason, 0)
    logged_before = certmanager.logs().count(f"tls.handshake_failed reason={reason}")
    address = certmanager.endpoint.grpc_address
    options = [("grpc.ssl_target_name_override", components.server_name("certmanager"))]
    if who == "no certificate":
        credentials = grpc.ssl_channel_credentials(root_certificates=ca.bundle_pem)
    else:
        material = (
            LocalCA().identity("proxy-cp").material
            if who == "foreign CA"
            else ca.identity("proxy-cp", expired=True).material
        )
        credentials = grpc.ssl_channel_credentials(
            ca.bundle_pem, material.key_pem, material.cert_chain_pem
        )
    async with grpc.aio.secure_channel(address, credentials, options=options) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await certmanager_pb2_grpc.CertificateManagerStub(channel).GetRoot(
                certmanager_pb2.GetRootRequest(), timeout=5
            )
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    await eventually(
        lambda: handshake_failures(certmanager).get(reason, 0) >= before + 1, timeout=10
    )
    # the line is logged by the tap's own thread after it counts, and written by the log
    # writer's: it may land a moment after the count
    await eventually(
        lambda: (
            certmanager.logs().count(f"tls.handshake_failed reason={reason}") >= logged_before + 1
        ),
        timeout=10,
    )


async def test_a_join_token_works_once_and_a_forged_one_not_at_all(
    services: dict[str, ServiceProcess], state_dir: Path
) -> None:
    certmanager = services["certmanager"]
    refused = 'trellis_certmanager_join_refused_total{{reason="{}"}}'.format
    reasons = ("spent", "invalid_token", "not_joinable")
    metrics = certmanager.get("/metrics").text
    before = {reason: sample(metrics, refused(reason)) for reason in reasons}
    logged = certmanager.logs().count("join.refused")
    key = jointoken.load_or_create_key(jointoken.key_path(state_dir))
    token = jointoken.mint(key, "injector")
    _, private = new_key()
    body = {"token": token, "csr_pem": csr_for(private, "injector").decode()}

    first = certmanager.post("/v1/join", json=body)
    again = certmanager.post("/v1/join", json=body)
    forged = certmanager.post(
        "/v1/join", json={**body, "token": jointoken.mint(b"x" * 32, "injector")}
    )
    as_certmanager = certmanager.post(
        "/v1/join", json={**body, "token": jointoken.mint(key, "certmanager")}
    )

    assert first.status_code == 200, first.text
    issued = x509.load_pem_x509_certificate(first.json()["cert_chain_pem"].encode())
    san = issued.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://cluster.local/ns/trellis-system/sa/injector"
    ]
    assert (again.status_code, again.json()["detail"]) == (
        401,
        "join token already used: a token works once",
    )
    assert forged.status_code == 401
    assert "not made with this mesh's join key" in forged.json()["detail"]
    assert as_certmanager.status_code == 401
    metrics = certmanager.get("/metrics").text
    for reason in reasons:
        assert sample(metrics, refused(reason)) == before[reason] + 1, reason
    # each refusal is logged through the log writer's thread: the line may land a moment
    # after the answer, so wait for the three, then check there is no fourth
    await eventually(lambda: certmanager.logs().count("join.refused") >= logged + 3, timeout=10)
    assert certmanager.logs().count("join.refused") == logged + 3
    assert token not in certmanager.logs()


async def test_no_component_gets_a_certificate_with_another_components_identity(
    services: dict[str, ServiceProcess], state_dir: Path
) -> None:
    certmanager = services["certmanager"]
    proxy_cp = join_as(state_dir, "proxy-cp")  # the one that may know service certificates
    series = (
        'trellis_certmanager_issue_refused_total{kind="service",reason="control_plane_namespace"}'
    )
    before = sample(certmanager.get("/metrics").text, series)
    logged = certmanager.logs()

    def ask(account: str) -> certmanager_pb2.IssueCertificateRequest:
        return certmanager_pb2.IssueCertificateRequest(
            kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE,
            service=certmanager_pb2.MeshService(namespace="trellis-system", name=account),
            service_account=account,
            omit_private_key=True,  # the cell proxy-cp holds: a service key is no one's
        )

    codes = []
    async with proxy_cp.channel(certmanager.endpoint.grpc_address, "certmanager") as channel:
        stub = certmanager_pb2_grpc.CertificateManagerStub(channel)
        # not even its own: proxy-cp serves xDS with its component certificate
        for account in ("proxy-cp", "certmanager"):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stub.IssueCertificate(ask(account))
            codes.append(caught.value.code())
            assert "the control plane's namespace" in (caught.value.details() or "")
    assert codes == [grpc.StatusCode.PERMISSION_DENIED] * 2
    assert sample(certmanager.get("/metrics").text, series) == before + 2
    logs = certmanager.logs()
    for account in ("proxy-cp", "certmanager"):
        line = (
            "cert.refused kind=service reason=control_plane_namespace "
            f"service=trellis-system/{account} "
            "requester=spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"
        )
        assert logs.count(line) == logged.count(line) + 1
