"""Certificate renewal on the xDS port: who may renew what, and every refusal counted.

The servicer is driven with a fake context (what grpc gives after the mTLS handshake, and an
``abort`` that raises as grpc's does); the caller's identity comes from a fake ``identify``
(the real one is :class:`~trellis_proxy_cp.authorizer.MeshAuthorizer`, tested on its own),
certmanager is a fake ``renew``.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn, cast

import grpc
import pytest
from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2 as cm
from trellis_api import proxy_pb2 as pb
from trellis_common.ids import ProxyCommonName
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.authorizer import PresentedProxy
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.metrics import XdsMetrics
from trellis_proxy_cp.renewal import ProxyCertificatesServicer
from trellis_proxy_cp.transport.streams import StreamRefused

PROXY = t.proxy_common_name("bookstore", "bookstore", 1)
OTHER = t.proxy_common_name("bookstore", "bookstore", 2)
CSR = b"-----BEGIN CERTIFICATE REQUEST-----\n..."


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class FakeContext:
    def __init__(self) -> None:
        self._auth = {"x509_common_name": [PROXY.encode()]}

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def peer(self) -> str:
        return "ipv4:127.0.0.1:4242"

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Aborted(code, details)


def presented(serial: str = "c0ffee") -> PresentedProxy:
    return PresentedProxy(PROXY, ProxyCommonName.parse(PROXY), serial, Expectation("bookstore"))


class Certmanager:
    """A fake ``RenewProxyCertificate``: records what it was asked, answers or fails."""

    def __init__(self, error: Exception | None = None) -> None:
        self.asked: list[tuple[str, str, bytes]] = []
        self.error = error

    async def __call__(self, common_name: str, serial: str, csr_pem: bytes) -> cm.Certificate:
        self.asked.append((common_name, serial, csr_pem))
        if self.error is not None:
            raise self.error
        return cm.Certificate(
            info=cm.CertificateInfo(common_name=common_name, serial="beef"),
            cert_chain_pem=b"new chain",
            trust_bundle_pem=b"bundle",
        )


class RpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def servicer(
    registry: CollectorRegistry, renew: Certmanager, refused: StreamRefused | None = None
) -> ProxyCertificatesServicer:
    async def identify(context: Any) -> PresentedProxy:
        if refused is not None:
            raise refused
        return presented()

    return ProxyCertificatesServicer(identify, renew, XdsMetrics(registry).renewals)


def count(registry: CollectorRegistry, outcome: str) -> float | None:
    return registry.get_sample_value("trellis_proxy_cp_renewals_total", {"outcome": outcome})


async def renew(service: ProxyCertificatesServicer, request: pb.RenewRequest) -> pb.RenewResponse:
    return await service.Renew(request, cast("grpc.aio.ServicerContext[Any, Any]", FakeContext()))


async def test_a_proxy_renews_its_own_certificate_with_the_presented_serial(
    registry: CollectorRegistry,
) -> None:
    certmanager = Certmanager()
    answer = await renew(servicer(registry, certmanager), pb.RenewRequest(csr_pem=CSR))
    assert (answer.cert_chain_pem, answer.serial) == (b"new chain", "beef")
    assert certmanager.asked == [(PROXY, "c0ffee", CSR)]
    assert count(registry, "renewed") == 1


async def test_naming_its_own_common_name_is_allowed(registry: CollectorRegistry) -> None:
    certmanager = Certmanager()
    await renew(servicer(registry, certmanager), pb.RenewRequest(csr_pem=CSR, common_name=PROXY))
    assert [name for name, _, _ in certmanager.asked] == [PROXY]


async def test_renewing_another_proxy_s_certificate_is_refused_logged_and_counted(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    certmanager = Certmanager()
    with caplog.at_level(logging.WARNING), pytest.raises(Aborted) as caught:
        await renew(
            servicer(registry, certmanager), pb.RenewRequest(csr_pem=CSR, common_name=OTHER)
        )
    assert caught.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert OTHER in caught.value.details
    assert certmanager.asked == []
    assert count(registry, "other_proxy") == 1
    assert f"renew.refused proxy={PROXY} reason=other_proxy" in caplog.text


async def test_a_caller_the_authorizer_refuses_is_refused_with_its_code_and_reason(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    certmanager = Certmanager()
    revoked = StreamRefused(
        grpc.StatusCode.PERMISSION_DENIED, "serial c0ffee is revoked", "revoked"
    )
    with caplog.at_level(logging.WARNING), pytest.raises(Aborted) as caught:
        await renew(servicer(registry, certmanager, revoked), pb.RenewRequest(csr_pem=CSR))
    assert (caught.value.code, caught.value.details) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "serial c0ffee is revoked",
    )
    assert certmanager.asked == []
    assert count(registry, "revoked") == 1
    assert f"renew.refused proxy={PROXY} reason=revoked" in caplog.text


async def test_a_missing_csr_is_invalid_argument_naming_it(registry: CollectorRegistry) -> None:
    with pytest.raises(Aborted) as caught:
        await renew(servicer(registry, Certmanager()), pb.RenewRequest())
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details.startswith("csr_pem: ")
    assert count(registry, "invalid_csr") == 1


@pytest.mark.parametrize(
    ("code", "expected_code", "reason"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.FAILED_PRECONDITION, "stale_serial"),
        (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INVALID_ARGUMENT, "invalid_csr"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, "certmanager_unavailable"),
    ],
)
async def test_certmanager_s_refusals_are_passed_on_and_counted(
    registry: CollectorRegistry,
    code: grpc.StatusCode,
    expected_code: grpc.StatusCode,
    reason: str,
) -> None:
    certmanager = Certmanager(RpcError(code, "certmanager says no"))
    with pytest.raises(Aborted) as caught:
        await renew(servicer(registry, certmanager), pb.RenewRequest(csr_pem=CSR))
    assert (caught.value.code, caught.value.details) == (expected_code, "certmanager says no")
    assert count(registry, reason) == 1
