"""The injector's REST API: ``POST /v1/bootstrap`` onboards one proxy.

The body carries the proxy's CSR (``csr_pem``): the proxy made its key on its own host, and
the answer (certificate, trust bundle, bootstrap) carries no private key. The route needs
the admin token, or an onboarding token scoped to the body's namespace and service account
(:mod:`trellis_identity.onboarding`); any other credential gets 401/403 naming why, and the
refusal is logged (``onboard.refused reason=... token_id=...``, never the token) and
counted (``trellis_injector_onboarding_refusals_total{reason}``). The answer is still
marked ``Cache-Control: no-store``. A body that is not acceptable gets 422 with ``field``
naming the first bad field (and ``errors`` listing all that pydantic found); a service the
injector needs that cannot be reached gets 503 with ``dependency`` naming it.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from trellis_identity import onboarding
from trellis_identity.tokens import AdminToken
from trellis_injector.domain.onboarding import (
    MAX_CSR_BYTES,
    PORT_MAX,
    AdsProtocol,
    InvalidOnboarding,
    Onboarding,
    ProxyRequest,
)
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder, Refused, Unavailable
from trellis_injector.transport import tokens as token_routes

log = logging.getLogger(__name__)

NO_STORE = {"Cache-Control": "no-store"}
_bearer = HTTPBearer(auto_error=False)


class BootstrapBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    namespace: str = Field(description="the proxy's service's namespace (a DNS label)")
    service: str = Field(description="the proxy's service (a DNS label)")
    service_account: str = Field("", description="identity for policy; default: the service")
    app_port: int = Field(
        0, ge=0, le=PORT_MAX, description="the application's port; 0: it only calls out"
    )
    kind: Literal["envoy", "grpc"] = Field(
        "envoy", description="an Envoy sidecar, or a proxyless gRPC workload (no ports)"
    )
    inbound_port: int = Field(0, ge=0, le=PORT_MAX, description="mTLS from peers (Envoy)")
    outbound_port: int = Field(0, ge=0, le=PORT_MAX, description="the app's calls out (Envoy)")
    admin_port: int = Field(0, ge=0, le=PORT_MAX, description="Envoy's admin API (Envoy)")
    stats_port: int = Field(
        0, ge=0, le=PORT_MAX, description="Envoy's Prometheus statistics; 0: not served"
    )
    protocol: AdsProtocol = Field("sotw", description="ADS flavour: state of the world or delta")
    locality: str = Field(
        "", description="where the proxy runs, region[/zone[/subzone]]: its node.locality"
    )
    output_dir: str = Field(description="absolute path of the files on the proxy's host")
    csr_pem: str = Field(
        max_length=MAX_CSR_BYTES,
        description="PEM certificate signing request for the key the proxy made on its host",
    )

    def request(self) -> ProxyRequest:
        return ProxyRequest(
            namespace=self.namespace,
            service=self.service,
            service_account=self.service_account,
            app_port=self.app_port,
            inbound_port=self.inbound_port,
            outbound_port=self.outbound_port,
            admin_port=self.admin_port,
            protocol=self.protocol,
            output_dir=self.output_dir,
            stats_port=self.stats_port,
            proxyless=self.kind == "grpc",
            locality=self.locality,
        )


def onboarding_json(done: Onboarding) -> dict[str, Any]:
    certificate = done.certificate
    files = done.files
    return {
        "common_name": done.common_name,
        "xds_address": str(done.control_plane.xds),
        "bootstrap": done.bootstrap,
        "files": {
            "cert_chain_pem": certificate.cert_chain_pem,
            "workload_cert_chain_pem": certificate.workload_cert_chain_pem,
            "trust_bundle_pem": certificate.trust_bundle_pem,
        },
        "paths": {
            "cert_chain": str(files.cert_chain),
            "workload_cert": str(done.request.workload_cert),
            "key": str(files.key),
            "trust_bundle": str(files.trust_bundle),
            # the SDS file naming the certificate and key in use (renewal swaps it)
            **({"sds": str(files.sds)} if files.sds is not None else {}),
        },
    }


def _field(location: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in location]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def add_routes(
    app: FastAPI,
    onboarder: Onboarder,
    guard: Any,
    admin_token: AdminToken,
    tokens: onboarding.TokenStore,
    metrics: InjectorMetrics,
) -> None:
    router = APIRouter(prefix="/v1", tags=["onboarding"])
    token_routes.add_routes(app, guard, tokens, metrics)

    def refusing(exc: onboarding.TokenRefused, identity: str) -> onboarding.TokenRefused:
        """Log and count a refused credential (never the token itself)."""
        metrics.refusals.labels(exc.reason.value).inc()
        log.warning(
            "onboard.refused reason=%s token_id=%s identity=%s detail=%r",
            exc.reason.value,
            exc.token_id,
            identity,
            exc.detail,
        )
        return exc

    async def authenticated(
        credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
    ) -> onboarding.Caller:
        """The admin token or a valid onboarding token, checked before the body is read (a
        caller without one learns nothing about what it sent)."""
        try:
            return await onboarding.authenticate(
                credentials.credentials if credentials else None, admin_token, tokens
            )
        except onboarding.TokenRefused as exc:
            raise refusing(exc, "-") from None

    @app.exception_handler(onboarding.TokenRefused)
    async def refused(_: Request, exc: onboarding.TokenRefused) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.detail, "reason": exc.reason.value, "token_id": exc.token_id},
            status_code=exc.status,
            headers={"WWW-Authenticate": "Bearer"} if exc.status == 401 else None,
        )

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"field": _field(e["loc"]), "message": e["msg"]} for e in exc.errors()]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        first = errors[0]["field"] if errors else "body"
        return JSONResponse({"detail": detail, "field": first, "errors": errors}, status_code=422)

    @app.exception_handler(InvalidOnboarding)
    async def invalid_request(_: Request, exc: InvalidOnboarding) -> JSONResponse:
        return JSONResponse(
            {
                "detail": str(exc),
                "field": exc.field,
                "errors": [{"field": exc.field, "message": exc.reason}],
            },
            status_code=422,
        )

    @router.post("/bootstrap")
    async def bootstrap(
        body: BootstrapBody,
        who: onboarding.Caller = Depends(authenticated),  # noqa: B008
    ) -> JSONResponse:
        """Onboard a proxy: a fresh proxy certificate for its CSR, and its bootstrap."""
        request = body.request()
        identity = f"{request.namespace}/{request.service} account={request.service_account}"
        try:  # a scoped token onboards its own service's workloads only, so many times
            who.check(request.namespace, request.service, request.service_account)
            if who.token is not None:
                await tokens.take_use(who.token)
        except onboarding.TokenRefused as exc:
            raise refusing(exc, identity) from None
        try:
            done = await onboarder.onboard(request, body.csr_pem)
        except (Unavailable, Refused) as exc:
            if who.token is not None:  # not onboarded: the use is not spent
                await tokens.give_back(who.token)
            return failed(request.identity, exc)
        metrics.onboarded.labels("admin" if who.token is None else "token").inc()
        log.info("onboard.accepted proxy=%s token_id=%s", done.common_name, who.token_id)
        return JSONResponse(onboarding_json(done), headers=NO_STORE)

    def failed(identity: str, exc: Unavailable | Refused) -> JSONResponse:
        """A dependency down (503) or refusing (422 for a bad argument, else 502)."""
        if isinstance(exc, Unavailable):
            log.warning(
                "injector.onboarding_failed identity=%s dependency=%s reason=%s",
                identity,
                exc.dependency,
                exc.reason,
            )
            return JSONResponse(
                {"detail": str(exc), "dependency": exc.dependency},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        log.warning(
            "injector.onboarding_refused identity=%s dependency=%s reason=%s",
            identity,
            exc.dependency,
            exc.reason,
        )
        answer = {"detail": str(exc), "dependency": exc.dependency}
        if exc.invalid_argument and "csr_pem: " in exc.reason:  # e.g. a key type refused
            answer["field"] = "csr_pem"
        return JSONResponse(answer, status_code=422 if exc.invalid_argument else 502)

    app.include_router(router)
