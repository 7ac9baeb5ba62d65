"""``trellis.proxy.v1.ProxyCertificates``: a proxy renews its own certificate on the xDS port.

proxy-cp is the only endpoint proxies talk to, so renewal is served here, on the same mTLS
port as ADS, and the caller is checked exactly as an xDS stream is
(:meth:`~trellis_proxy_cp.authorizer.MeshAuthorizer.identify`): a proxy certificate of the
mesh CA, a serial that is not revoked, the proxy expected with that serial. The common name
renewed is the one on the presented certificate; a request naming another is refused
(``other_proxy``): a proxy renews only its own certificate. proxy-cp then asks certmanager
(``RenewProxyCertificate``, a cell only proxy-cp holds) for a certificate of the same common
name for the CSR's key; certmanager checks that the presented serial is still the current
one and revokes it (reason ``rotated``). The ``revoked`` signal that follows ends the
proxy's xDS streams opened with the old certificate; Envoy reconnects with the new one,
which the renewer has written where the bootstrap's SDS file points.

Every refusal is logged (``renew.refused proxy=... reason=...``), counted in
``trellis_proxy_cp_renewals_total{outcome=<reason>}`` and answered with a status naming what
is wrong; a renewal is counted under ``renewed``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc
from prometheus_client import Counter

from trellis_api import certmanager_pb2 as cm
from trellis_api import proxy_pb2 as pb
from trellis_api import proxy_pb2_grpc as pb_grpc
from trellis_proxy_cp.authorizer import PresentedProxy, peer_common_name
from trellis_proxy_cp.transport.streams import StreamRefused
from trellis_runtime.locate import OwnerUnavailable

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
Identify = Callable[[Context], Awaitable[PresentedProxy]]
#: (common name, presented serial, CSR) -> the certificate certmanager issued.
Renew = Callable[[str, str, bytes], Awaitable[cm.Certificate]]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ProxyCertificates"].full_name
MAX_CSR_BYTES = 16 * 1024

#: certmanager's answers that are the caller's fault, passed on with their code.
_CALLER_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_csr",
    grpc.StatusCode.FAILED_PRECONDITION: "stale_serial",
    grpc.StatusCode.NOT_FOUND: "not_expected",
}


class ProxyCertificatesServicer(pb_grpc.ProxyCertificatesServicer):
    def __init__(self, identify: Identify, renew: Renew, renewals: Counter) -> None:
        self._identify = identify
        self._renew = renew
        self._renewals = renewals

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_ProxyCertificatesServicer_to_server(self, server)

    async def Renew(self, request: pb.RenewRequest, context: Context) -> pb.RenewResponse:
        try:
            presented = await self._identify(context)
        except StreamRefused as refused:
            await self._refuse(context, peer_common_name(context) or "-", refused)
        common_name = presented.common_name
        if request.common_name and request.common_name != common_name:
            await self._refuse(
                context,
                common_name,
                StreamRefused(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"proxy {common_name} may renew only its own certificate, not "
                    f"{request.common_name!r}",
                    "other_proxy",
                ),
            )
        if not request.csr_pem or len(request.csr_pem) > MAX_CSR_BYTES:
            await self._refuse(
                context,
                common_name,
                StreamRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"csr_pem: a PEM certificate signing request of at most {MAX_CSR_BYTES} "
                    f"bytes is required",
                    "invalid_csr",
                ),
            )
        try:
            issued = await self._renew(common_name, presented.serial, request.csr_pem)
        except grpc.aio.AioRpcError as exc:
            reason = _CALLER_ERRORS.get(exc.code())
            if reason is None:
                code, reason = grpc.StatusCode.UNAVAILABLE, "certmanager_unavailable"
            else:
                code = exc.code()
            await self._refuse(
                context, common_name, StreamRefused(code, exc.details() or code.name, reason)
            )
        except OwnerUnavailable as exc:
            await self._refuse(
                context,
                common_name,
                StreamRefused(
                    grpc.StatusCode.UNAVAILABLE,
                    f"certmanager cannot be reached ({exc}); retry later",
                    "certmanager_unavailable",
                ),
            )
        self._renewals.labels("renewed").inc()
        log.info(
            "renew.renewed proxy=%s old_serial=%s serial=%s not_after=%s",
            common_name,
            presented.serial,
            issued.info.serial,
            issued.info.not_after.ToDatetime().isoformat(),
        )
        return pb.RenewResponse(
            cert_chain_pem=issued.cert_chain_pem,
            trust_bundle_pem=issued.trust_bundle_pem,
            serial=issued.info.serial,
            not_before=issued.info.not_before,
            not_after=issued.info.not_after,
            workload_cert_chain_pem=issued.workload_cert_chain_pem,
        )

    async def _refuse(self, context: Context, proxy: str, refused: StreamRefused) -> NoReturn:
        self._renewals.labels(refused.reason).inc()
        log.warning(
            "renew.refused proxy=%s reason=%s code=%s detail=%r peer=%s",
            proxy,
            refused.reason,
            refused.code.name,
            refused.message,
            context.peer(),
        )
        await context.abort(refused.code, refused.message)
        raise AssertionError("abort returned")  # pragma: no cover (abort raises)
