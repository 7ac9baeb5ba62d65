"""The injector's REST API for onboarding tokens: create, list, revoke.

Every route needs the admin token: a scoped onboarding token is made by an operator for
one identity (``trellis token create``), and is shown once, in the creation answer
(``Cache-Control: no-store``); listings carry what each token is for, never a token or its
digest. A token for the control plane's namespace, or with a bad name or TTL, is refused
with 422 naming the field, logged (``token.refused``) and counted
(``trellis_injector_onboarding_tokens_total{event="refused"}``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from trellis_identity import onboarding
from trellis_injector.metrics import InjectorMetrics

log = logging.getLogger(__name__)


class TokenBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    namespace: str = Field(description="the namespace the token onboards into")
    service: str = Field(description="the one service whose workloads it onboards")
    service_account: str = Field(description="the service account those workloads run as")
    ttl_seconds: float = Field(
        3600.0, description=f"lifetime, {onboarding.MIN_TTL:g} s to {onboarding.MAX_TTL:g} s"
    )
    uses: int = Field(1, description=f"how many workloads it onboards, 1 to {onboarding.MAX_USES}")


def add_routes(
    app: FastAPI, guard: Any, tokens: onboarding.TokenStore, metrics: InjectorMetrics
) -> None:
    router = APIRouter(prefix="/v1/tokens", tags=["tokens"], dependencies=[Depends(guard)])

    @router.post("", status_code=201)
    async def create(body: TokenBody) -> JSONResponse:
        """A token for one service's workloads (namespace, service, service account, how
        many); the answer is the only place the token is ever shown."""
        try:
            token, record = await tokens.create(
                body.namespace, body.service, body.service_account, body.ttl_seconds, body.uses
            )
        except onboarding.InvalidTokenRequest as exc:
            metrics.tokens.labels("refused").inc()
            log.warning(
                "token.refused field=%s reason=%r identity=%s/%s account=%s",
                exc.field,
                exc.reason,
                body.namespace,
                body.service,
                body.service_account,
            )
            return JSONResponse(
                {
                    "detail": str(exc),
                    "field": exc.field,
                    "errors": [{"field": exc.field, "message": exc.reason}],
                },
                status_code=422,
            )
        metrics.tokens.labels("created").inc()
        log.info(
            "token.created token_id=%s identity=%r uses=%d expires_at=%.0f",
            record.id,
            record.identity,
            record.uses,
            record.expires_at,
        )
        return JSONResponse(
            {"token": token, **record.metadata()},
            status_code=201,
            headers={"Cache-Control": "no-store"},
        )

    @router.get("")
    async def list_tokens() -> dict[str, Any]:
        return {"tokens": [r.metadata() for r in await tokens.active()]}

    @router.delete("/{token_id}", status_code=204)
    async def revoke(token_id: str) -> None:
        if onboarding.token_id(f"{onboarding.TOKEN_PREFIX}.{token_id}.{'x' * 43}") is None:
            raise HTTPException(422, f"token_id: {token_id!r} is not a token id (16 hex digits)")
        if not await tokens.revoke(token_id):
            raise HTTPException(404, f"no onboarding token {token_id} (revoked or expired?)")
        metrics.tokens.labels("revoked").inc()
        log.info("token.revoked token_id=%s", token_id)

    app.include_router(router)
