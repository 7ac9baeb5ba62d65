"""The injector's REST API: ``POST /v1/bootstrap`` onboards one proxy.

The answer carries the proxy's private key, so the route needs the admin token, the
answer is marked ``Cache-Control: no-store``, and nothing here logs more than the CN.
A body that is not acceptable gets 422 with ``field`` naming the first bad field (and
``errors`` listing all that pydantic found); a service the injector needs that cannot be
reached gets 503 with ``dependency`` naming it.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from trellis_injector.domain.onboarding import (
    PORT_MAX,
    PORT_MIN,
    AdsProtocol,
    InvalidOnboarding,
    Onboarding,
    ProxyRequest,
)
from trellis_injector.onboarder import Onboarder, Refused, Unavailable

log = logging.getLogger(__name__)

NO_STORE = {"Cache-Control": "no-store"}


class BootstrapBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    namespace: str = Field(description="the proxy's service's namespace (a DNS label)")
    service: str = Field(description="the proxy's service (a DNS label)")
    service_account: str = Field("", description="identity for policy; default: the service")
    app_port: int = Field(
        0, ge=0, le=PORT_MAX, description="the application's port; 0: it only calls out"
    )
    inbound_port: int = Field(ge=PORT_MIN, le=PORT_MAX, description="mTLS from peers")
    outbound_port: int = Field(ge=PORT_MIN, le=PORT_MAX, description="the app's calls out")
    admin_port: int = Field(ge=PORT_MIN, le=PORT_MAX, description="Envoy's admin API")
    protocol: AdsProtocol = Field("sotw", description="ADS flavour: state of the world or delta")
    output_dir: str = Field(description="absolute path of the files on the proxy's host")

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
            "private_key_pem": certificate.private_key_pem,
            "trust_bundle_pem": certificate.trust_bundle_pem,
        },
        "paths": {
            "cert_chain": str(files.cert_chain),
            "key": str(files.key),
            "trust_bundle": str(files.trust_bundle),
        },
    }


def _field(location: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in location]
    if parts and parts[0] == "body":
        parts = parts[1:]
    return ".".join(parts) or "body"


def add_routes(app: FastAPI, onboarder: Onboarder, guard: Any) -> None:
    router = APIRouter(prefix="/v1", tags=["onboarding"])

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

    @router.post("/bootstrap", dependencies=[Depends(guard)])
    async def bootstrap(body: BootstrapBody) -> JSONResponse:
        """Onboard a proxy: a fresh proxy certificate (with its key) and its bootstrap."""
        request = body.request()
        try:
            done = await onboarder.onboard(request)
        except Unavailable as exc:
            log.warning(
                "injector.onboarding_failed identity=%s dependency=%s reason=%s",
                request.identity,
                exc.dependency,
                exc.reason,
            )
            return JSONResponse(
                {"detail": str(exc), "dependency": exc.dependency},
                status_code=503,
                headers={"Retry-After": "1"},
            )
        except Refused as exc:
            log.warning(
                "injector.onboarding_refused identity=%s dependency=%s reason=%s",
                request.identity,
                exc.dependency,
                exc.reason,
            )
            return JSONResponse(
                {"detail": str(exc), "dependency": exc.dependency},
                status_code=422 if exc.invalid_argument else 502,
            )
        return JSONResponse(onboarding_json(done), headers=NO_STORE)

    app.include_router(router)
