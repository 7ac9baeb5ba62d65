"""Onboarding a proxy end to end, behind three small seams.

:class:`Onboarder` asks where proxy-cp is, has certmanager issue a fresh proxy certificate
for the proxy's CSR, tells the catalog to expect that proxy, and builds the bootstrap. The
proxy's key never crosses the wire: a VM's proxy makes it on its host and sends a CSR
(:meth:`Onboarder.onboard`); an injected pod's agent enrolls through proxy-cp instead, with
its pod's token (``trellis_cli.agent``). The seams are ``Protocol``s
(:class:`CertificateIssuer`, :class:`ProxyExpectations`, :class:`ControlPlaneLocator`):
``clients`` implements them over gRPC and the service registry, ``testing`` in memory, and
the REST route only sees the Onboarder.

Order matters: proxy-cp is looked up first, so that no certificate is issued for a proxy
that could not be told where to connect. The catalog is told after the issue; if it is
down the request fails (503) and the certificate is left unused, which is harmless: the
caller got nothing and keeps its key (the catalog marks every proxy certificate on record
as expected when it reconnects to certmanager, so it would be ready anyway).

Only the proxy's CN is logged, never a key.
"""

from __future__ import annotations

import logging
from typing import Protocol

from trellis_common.ids import SpiffeId
from trellis_injector.domain.onboarding import (
    ControlPlane,
    InvalidOnboarding,
    MeshSidecar,
    Onboarding,
    ProxyCertificate,
    ProxyRequest,
    XdsEndpoint,
    check_csr,
    onboarding,
)

log = logging.getLogger(__name__)


class Unavailable(Exception):
    """A service onboarding needs cannot be reached (or found); ``dependency`` names it."""

    def __init__(self, dependency: str, reason: str) -> None:
        self.dependency = dependency
        self.reason = reason
        super().__init__(f"{dependency} is unavailable: {reason}")


class Refused(Exception):
    """A service onboarding needs answered with an error; ``dependency`` names it."""

    def __init__(self, dependency: str, reason: str, invalid_argument: bool = False) -> None:
        self.dependency = dependency
        self.reason = reason
        self.invalid_argument = invalid_argument
        super().__init__(f"{dependency} refused: {reason}")


class CertificateIssuer(Protocol):
    async def issue_proxy_certificate(
        self,
        namespace: str,
        service: str,
        service_account: str,
        csr_pem: bytes,
        proxy_id: str = "",
    ) -> ProxyCertificate:
        """A proxy certificate for the key of ``csr_pem``: of a new proxy (a fresh UUID),
        or a renewal for ``proxy_id`` (its old serial is revoked)."""
        ...


class ProxyExpectations(Protocol):
    async def expect_proxy(self, common_name: str, service_account: str) -> MeshSidecar:
        """Tell the catalog the proxy with this CN may connect to proxy-cp; its answer
        carries MeshConfig's sidecar settings."""
        ...


class ControlPlaneLocator(Protocol):
    async def xds_endpoint(self) -> XdsEndpoint:
        """Where proxies dial proxy-cp's xDS port."""
        ...


class Onboarder:
    def __init__(
        self,
        certificates: CertificateIssuer,
        catalog: ProxyExpectations,
        locator: ControlPlaneLocator,
        proxy_cp_spiffe_id: str,
    ) -> None:
        self.certificates = certificates
        self._catalog = catalog
        self._locator = locator
        self._spiffe_id = proxy_cp_spiffe_id
        # proxy-cp's namespace is the control plane's: nothing is onboarded into it
        self.reserved_namespace = SpiffeId.parse(proxy_cp_spiffe_id).namespace

    async def onboard(self, request: ProxyRequest, csr_pem: str | bytes) -> Onboarding:
        """Onboard a proxy that made its own key and sent ``csr_pem``. Raises
        :class:`Unavailable` or :class:`Refused` naming the service at fault, and
        :class:`InvalidOnboarding` for the control plane's own namespace or a bad CSR."""
        csr = check_csr(csr_pem)
        if request.namespace == self.reserved_namespace:
            raise InvalidOnboarding(
                "namespace",
                f"{request.namespace!r} is the control plane's namespace: its identities "
                "cannot be onboarded",
            )
        control_plane = ControlPlane(await self._locator.xds_endpoint(), self._spiffe_id)
        certificate = await self.certificates.issue_proxy_certificate(
            request.namespace, request.service, request.service_account, csr
        )
        mesh = await self._catalog.expect_proxy(certificate.common_name, request.service_account)
        log.info(
            "injector.onboarded proxy=%s identity=%s service_account=%s xds=%s protocol=%s",
            certificate.common_name,
            request.identity,
            request.service_account,
            control_plane.xds,
            request.protocol,
        )
        return onboarding(request, certificate, control_plane, mesh)
