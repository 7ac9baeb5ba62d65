"""Fakes for tests of code that uses the Onboarder's seams.

Each fake has an ``error`` attribute: set it (e.g. to ``Unavailable("certmanager", ...)``)
and the next calls raise it, as an outage would.
"""

from __future__ import annotations

import asyncio
import uuid

from trellis_injector.domain.onboarding import MeshSidecar, ProxyCertificate, XdsEndpoint

FAKE_CERT_PEM = "-----BEGIN CERTIFICATE-----\nZmFrZSBjZXJ0\n-----END CERTIFICATE-----\n"
FAKE_CA_PEM = "-----BEGIN CERTIFICATE-----\nZmFrZSBjYQ==\n-----END CERTIFICATE-----\n"


class FakeCertificates:
    """A :class:`~trellis_injector.onboarder.CertificateIssuer` that makes up certificates."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        #: set to an unset Event and calls hang until it is set (a stalled certmanager)
        self.hold: asyncio.Event | None = None
        self.calls = 0
        self.issued: list[tuple[str, str]] = []  # (common name, service account)
        self.csrs: list[bytes] = []  # what each issue was asked to sign

    async def issue_proxy_certificate(
        self,
        namespace: str,
        service: str,
        service_account: str,
        csr_pem: bytes,
        proxy_id: str = "",
    ) -> ProxyCertificate:
        self.calls += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.error is not None:
            raise self.error
        common_name = f"{proxy_id or uuid.uuid4()}.{service}.{namespace}"
        self.issued.append((common_name, service_account))
        self.csrs.append(csr_pem)
        return ProxyCertificate(common_name, FAKE_CERT_PEM, FAKE_CA_PEM, FAKE_CERT_PEM)


class FakeCatalog:
    """A :class:`~trellis_injector.onboarder.ProxyExpectations` in a dict."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        #: set to an unset Event and settings calls hang until it is set (a stalled catalog)
        self.hold: asyncio.Event | None = None
        self.calls = 0
        self.expected: dict[str, str] = {}  # common name -> service account
        self.sidecar = MeshSidecar()  # what MeshConfig says of sidecars

    async def sidecar_settings(self) -> MeshSidecar:
        self.calls += 1
        if self.hold is not None:
            await self.hold.wait()
        if self.error is not None:
            raise self.error
        return self.sidecar

    async def expect_proxy(self, common_name: str, service_account: str) -> MeshSidecar:
        if self.error is not None:
            raise self.error
        self.expected[common_name] = service_account
        return self.sidecar


class FixedControlPlane:
    """A :class:`~trellis_injector.onboarder.ControlPlaneLocator` with one address."""

    def __init__(self, host: str = "127.0.0.1", port: int = 15128, enroll: int = 15012) -> None:
        self.error: Exception | None = None
        self.endpoint = XdsEndpoint(host, port)
        self.enroll = XdsEndpoint(host, enroll)

    async def enroll_endpoint(self) -> XdsEndpoint:
        if self.error is not None:
            raise self.error
        return self.enroll

    async def xds_endpoint(self) -> XdsEndpoint:
        if self.error is not None:
            raise self.error
        return self.endpoint
