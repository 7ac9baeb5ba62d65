"""``trellis.proxy.v1.ProxyEnrollment``: a pod's agent enrolls its proxy with its token.

A pod has no certificate before it enrolls, so this is served on its own port (the
enrollment port, 15012 as Istio's CA port), with server TLS only: the agent checks proxy-cp's
certificate against the mesh root the injector gave it. The caller proves who it is with
its pod's projected ServiceAccount token, sent as ``authorization: Bearer <token>``, and
sends a CSR for the key it made in the pod. proxy-cp passes both to certmanager
(``EnrollProxy``, a cell only proxy-cp holds), which has the API server review the token and
signs the proxy and workload certificates (certmanager's ``enrollment.py``); then it tells
the catalog to expect the proxy, as the injector does at onboarding.

proxy-cp never reads the token itself and logs none of it. Every refusal is logged
(``enroll.refused reason=...``), counted in
``trellis_proxy_cp_enrollments_total{outcome=<reason>}`` and answered with a status that
names what is wrong; an enrollment is counted under ``enrolled``.
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
from trellis_runtime.locate import OwnerUnavailable

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]
#: (token, CSR, service) -> what certmanager issued.
Enroll = Callable[[str, bytes, str], Awaitable[cm.EnrolledProxy]]
#: (proxy common name, service account) -> the catalog told.
Expect = Callable[[str, str], Awaitable[None]]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ProxyEnrollment"].full_name
MAX_CSR_BYTES = 16 * 1024
MAX_TOKEN_BYTES = 16 * 1024

#: certmanager's refusals, passed on with their code.
_CALLER_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid",
    grpc.StatusCode.PERMISSION_DENIED: "denied",
    grpc.StatusCode.UNAUTHENTICATED: "not_authenticated",
    grpc.StatusCode.FAILED_PRECONDITION: "no_kubernetes",
}


class Refusal(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, reason: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason


def bearer(context: Context) -> str:
    """The token of the call's ``authorization: Bearer <token>`` metadata, or ""."""
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "authorization" and isinstance(value, str):
            scheme, _, token = value.partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return ""


def certmanager_reason(details: str) -> str:
    """The reason certmanager named (``enroll.refused`` messages start with it), else ""."""
    for reason in (
        "no_token", "not_bound", "wrong_audience", "not_authenticated", "not_a_service_account",
        "control_plane_namespace", "bad_csr", "bad_service", "no_kubernetes",
    ):  # fmt: skip
        if details.startswith(reason + ":"):
            return reason
    return ""


class EnrollmentServicer(pb_grpc.ProxyEnrollmentServicer):
    def __init__(self, enroll: Enroll, expect: Expect, outcomes: Counter) -> None:
        self._enroll = enroll
        self._expect = expect
        self._outcomes = outcomes

    def register(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_ProxyEnrollmentServicer_to_server(self, server)

    async def Enroll(self, request: pb.EnrollRequest, context: Context) -> pb.EnrollResponse:
        try:
            enrolled = await self._enrolled(request, context)
        except Refusal as refusal:
            await self._refuse(context, request.service, refusal)
        proxy = enrolled.proxy.info
        self._outcomes.labels("enrolled").inc()
        log.info(
            "enroll.enrolled proxy=%s pod=%s/%s spiffe=%s serial=%s",
            proxy.common_name,
            enrolled.namespace,
            enrolled.pod_name,
            enrolled.spiffe_id,
            proxy.serial,
        )
        return pb.EnrollResponse(
            proxy_cert_chain_pem=enrolled.proxy.cert_chain_pem,
            workload_cert_chain_pem=enrolled.workload_cert_chain_pem,
            trust_bundle_pem=enrolled.proxy.trust_bundle_pem,
            node_id=proxy.common_name,
            spiffe_id=enrolled.spiffe_id,
            not_after=proxy.not_after,
        )

    async def _enrolled(self, request: pb.EnrollRequest, context: Context) -> cm.EnrolledProxy:
        token = bearer(context)
        if not token:
            raise Refusal(
                grpc.StatusCode.UNAUTHENTICATED,
                "no token: send the pod's projected ServiceAccount token as "
                "'authorization: Bearer <token>'",
                "no_token",
            )
        if len(token) > MAX_TOKEN_BYTES:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "the token is too long", "bad_token")
        if not request.csr_pem or len(request.csr_pem) > MAX_CSR_BYTES:
            raise Refusal(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"csr_pem: a PEM certificate signing request of at most {MAX_CSR_BYTES} bytes "
                "is required",
                "bad_csr",
            )
        try:
            enrolled = await self._enroll(token, request.csr_pem, request.service)
            await self._expect(enrolled.proxy.info.common_name, enrolled.service_account)
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or exc.code().name
            reason = _CALLER_ERRORS.get(exc.code())
            if reason is None:
                raise Refusal(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the control plane cannot enroll proxies now ({details}); retry later",
                    "unavailable",
                ) from exc
            raise Refusal(exc.code(), details, certmanager_reason(details) or reason) from exc
        except OwnerUnavailable as exc:
            raise Refusal(
                grpc.StatusCode.UNAVAILABLE,
                f"the control plane cannot enroll proxies now ({exc}); retry later",
                "unavailable",
            ) from exc
        return enrolled

    async def _refuse(self, context: Context, service: str, refusal: Refusal) -> NoReturn:
        self._outcomes.labels(refusal.reason).inc()
        log.warning(
            "enroll.refused service=%s reason=%s code=%s detail=%r peer=%s",
            service or "-",
            refusal.reason,
            refusal.code.name,
            refusal.message,
            context.peer(),
        )
        await context.abort(refusal.code, refusal.message)
        raise AssertionError("abort returned")  # pragma: no cover (abort raises)
