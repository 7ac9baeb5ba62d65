"""The injector's side of certmanager, the catalog and proxy-cp.

Each service is found at its configured address, else in the service registry
(:func:`trellis_runtime.registry.discover`), at every call: onboarding is rare, and a fresh
lookup follows a service that restarted elsewhere. For the same reason each call opens its
own channel: a long-lived channel to a service that was down stays in gRPC's reconnect
backoff for up to two minutes after the service is back.

Failures become the Onboarder's errors, naming the service: not found, unreachable or too
slow is :class:`~trellis_injector.onboarder.Unavailable` (503), any other answer is
:class:`~trellis_injector.onboarder.Refused`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

import grpc
import redis.asyncio
from redis.exceptions import RedisError

from trellis_api import catalog_pb2, catalog_pb2_grpc
from trellis_api import certmanager_pb2 as cm
from trellis_api import certmanager_pb2_grpc as cm_grpc
from trellis_injector.domain.onboarding import MeshSidecar, ProxyCertificate, XdsEndpoint
from trellis_injector.onboarder import Refused, Unavailable
from trellis_kube.injection import Exclusions
from trellis_runtime.registry import ServiceRecord, discover

log = logging.getLogger(__name__)

CERTMANAGER = "certmanager"
CATALOG = "catalog"
PROXY_CP = "proxy-cp"

T = TypeVar("T")

_UNAVAILABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,
}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


KindChannelFactory = Callable[[str, str], grpc.aio.Channel]


class ServiceLocator:
    """gRPC addresses of other services: configured (``kind`` -> ``host:port``) or announced."""

    def __init__(
        self,
        redis: redis.asyncio.Redis,
        configured: Mapping[str, str],
        timeout: float = 5.0,
        channel_factory: KindChannelFactory | None = None,
    ) -> None:
        self._redis = redis
        #: (address, kind) -> a channel; mTLS with the injector's identity in the service
        self.channel = channel_factory or (lambda address, kind: grpc.aio.insecure_channel(address))
        self._configured = {kind: address for kind, address in configured.items() if address}
        self._timeout = timeout

    async def address(self, kind: str) -> str:
        configured = self._configured.get(kind)
        if configured:
            return configured
        return (await self._first(kind)).grpc_address

    async def attribute(self, kind: str, name: str) -> str:
        """An attribute the first live instance of ``kind`` announces ("" if none)."""
        return (await self._first(kind)).attribute_map.get(name, "")

    async def _first(self, kind: str) -> ServiceRecord:
        try:
            async with asyncio.timeout(self._timeout):
                found = await discover(self._redis, kind)
        except (RedisError, OSError, TimeoutError) as exc:
            raise Unavailable(
                kind, f"the service registry (Redis) cannot be read: {_describe(exc)}"
            ) from exc
        if not found:
            raise Unavailable(kind, "no live instance in the service registry")
        return found[0]


async def _call(
    services: ServiceLocator,
    dependency: str,
    address: str,
    rpc: Callable[[grpc.aio.Channel], Awaitable[T]],
) -> T:
    try:
        async with services.channel(address, dependency) as channel:
            return await rpc(channel)
    except grpc.aio.AioRpcError as exc:
        reason = f"{exc.code().name} at {address}: {exc.details()}"
        if exc.code() in _UNAVAILABLE:
            raise Unavailable(dependency, reason) from exc
        raise Refused(
            dependency, reason, invalid_argument=exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        ) from exc


class CertManagerClient:
    """Issues proxy certificates (kind PROXY: a fresh proxy UUID each time, for a CSR)."""

    def __init__(self, services: ServiceLocator, timeout: float = 5.0) -> None:
        self._services = services
        self._timeout = timeout

    async def issue_proxy_certificate(
        self,
        namespace: str,
        service: str,
        service_account: str,
        csr_pem: bytes,
        proxy_id: str = "",
    ) -> ProxyCertificate:
        address = await self._services.address(CERTMANAGER)
        request = cm.IssueCertificateRequest(
            kind=cm.CERTIFICATE_KIND_PROXY,
            service=cm.MeshService(namespace=namespace, name=service),
            service_account=service_account,
            csr_pem=csr_pem,
            proxy_id=proxy_id,
        )

        async def issue(channel: grpc.aio.Channel) -> cm.Certificate:
            stub: cm_grpc.CertificateManagerAsyncStub = cm_grpc.CertificateManagerStub(channel)
            return await stub.IssueCertificate(request, timeout=self._timeout)

        certificate = await _call(self._services, CERTMANAGER, address, issue)
        if (
            not certificate.cert_chain_pem
            or not certificate.workload_cert_chain_pem
            or not certificate.info.common_name
        ):
            raise Refused(
                CERTMANAGER, "the answer has no common name, proxy or workload certificate"
            )
        return ProxyCertificate(
            common_name=certificate.info.common_name,
            cert_chain_pem=certificate.cert_chain_pem.decode(),
            trust_bundle_pem=certificate.trust_bundle_pem.decode(),
            workload_cert_chain_pem=certificate.workload_cert_chain_pem.decode(),
        )


class CatalogClient:
    """Tells the catalog which proxies to expect (ExpectProxy)."""

    def __init__(self, services: ServiceLocator, timeout: float = 5.0) -> None:
        self._services = services
        self._timeout = timeout

    async def expect_proxy(self, common_name: str, service_account: str) -> MeshSidecar:
        address = await self._services.address(CATALOG)
        request = catalog_pb2.ExpectProxyRequest(
            common_name=common_name, service_account=service_account
        )

        async def expect(channel: grpc.aio.Channel) -> catalog_pb2.ProxyAck:
            stub: catalog_pb2_grpc.CatalogAsyncStub = catalog_pb2_grpc.CatalogStub(channel)
            return await stub.ExpectProxy(request, timeout=self._timeout)

        ack = await _call(self._services, CATALOG, address, expect)
        return _mesh_sidecar(ack.sidecar)

    async def sidecar_settings(self) -> MeshSidecar:
        """MeshConfig's sidecar settings, asked without expecting any proxy."""
        address = await self._services.address(CATALOG)

        async def ask(channel: grpc.aio.Channel) -> catalog_pb2.SidecarSettings:
            stub: catalog_pb2_grpc.CatalogAsyncStub = catalog_pb2_grpc.CatalogStub(channel)
            return await stub.GetSidecarSettings(
                catalog_pb2.GetSidecarSettingsRequest(), timeout=self._timeout
            )

        return _mesh_sidecar(await _call(self._services, CATALOG, address, ask))


def _mesh_sidecar(sidecar: catalog_pb2.SidecarSettings) -> MeshSidecar:
    return MeshSidecar(
        log_level=sidecar.log_level,
        exclusions=Exclusions(
            inbound_ports=tuple(sidecar.inbound_port_exclusions),
            outbound_ports=tuple(sidecar.outbound_port_exclusions),
            outbound_ranges=tuple(sidecar.outbound_ip_range_exclusions),
        ),
    )


class XdsLocator:
    """Where proxies dial proxy-cp: the configured host/port, the rest as proxy-cp announces.

    proxy-cp announces the address it binds; a proxy on another machine needs one it can
    reach, which is what ``TRELLIS_INJECTOR_XDS_HOST`` is for.
    """

    def __init__(
        self, services: ServiceLocator, host: str = "", port: int = 0, enroll_port: int = 0
    ) -> None:
        self._services = services
        self._host = host
        self._port = port
        self._enroll_port = enroll_port

    async def enroll_endpoint(self) -> XdsEndpoint:
        """Where pod agents enroll: the xDS host, on proxy-cp's enrollment port (the
        configured one, else the one proxy-cp announces)."""
        xds = await self.xds_endpoint()
        port = self._enroll_port
        if not port:
            announced = await self._services.attribute(PROXY_CP, "enroll_port")
            if not announced.isdigit():
                raise Unavailable(PROXY_CP, "announces no enrollment port (enroll_port)")
            port = int(announced)
        return XdsEndpoint(xds.host, port)

    async def xds_endpoint(self) -> XdsEndpoint:
        if self._host and self._port:
            return XdsEndpoint(self._host, self._port)
        address = await self._services.address(PROXY_CP)
        try:
            announced = XdsEndpoint.parse(address)
        except ValueError as exc:
            raise Unavailable(PROXY_CP, f"announces an unusable address: {exc}") from exc
        host = self._host or announced.host
        if host in ("0.0.0.0", "::"):
            log.warning(
                "injector.xds_host_unspecified address=%s "
                "action='set TRELLIS_INJECTOR_XDS_HOST to an address proxies can reach'",
                address,
            )
        return XdsEndpoint(host, self._port or announced.port)
