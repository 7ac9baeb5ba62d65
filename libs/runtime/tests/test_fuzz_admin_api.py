"""Schemathesis against the admin app every service shares, and what it found.

Found by the services' fuzz suites, fixed in :mod:`trellis_runtime.admin`: ``/metrics`` was
documented as JSON though it answers Prometheus text, and a 422 was documented as
pydantic's list of errors only, though a refused value (the ``ValueError`` handler, the
services' own handlers) answers one sentence in ``detail``.
"""

from __future__ import annotations

from typing import Any

import httpx
import schemathesis
from fastapi import Depends, FastAPI
from prometheus_client import CollectorRegistry

from trellis_common.ids import validate_dns_label
from trellis_identity.tokens import AdminToken
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_testing import adminfuzz


def admin_app() -> FastAPI:
    metrics = CollectorRegistry()
    health = Health(metrics)
    health.rejections.reject("grpc", "IssueCertificate", "service_account: 'Bad Name!' ...")
    app = admin.create_app("common", metrics, {"always": lambda: True}, health)

    @app.get("/v1/names/{name}")
    async def name(name: str) -> dict[str, str]:
        return {"name": validate_dns_label(name, "name")}  # a ValueError is a 422

    @app.post(
        "/v1/reset", dependencies=[Depends(admin.token_guard(AdminToken.of(adminfuzz.TOKEN)))]
    )
    async def reset() -> dict[str, bool]:
        return {"reset": True}

    return app


schema = adminfuzz.schema_of(admin_app())


@schema.parametrize()
def test_admin_api(case: schemathesis.Case[Any]) -> None:
    adminfuzz.exercise(case)


def test_metrics_are_documented_as_the_text_they_are() -> None:
    document = admin_app().openapi()
    content = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(content) == ["text/plain"]


async def test_a_refused_value_is_a_documented_422_with_a_sentence() -> None:
    app = admin_app()
    detail = app.openapi()["components"]["schemas"]["HTTPValidationError"]["properties"]["detail"]
    assert detail["anyOf"][0] == {"type": "string"}
    assert detail["anyOf"][1]["type"] == "array"
    assert app.openapi()["components"] == app.openapi()["components"]  # stable when re-read

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        response = await client.get("/v1/names/Bad_Name")

    assert response.status_code == 422
    assert response.json()["detail"].startswith("name 'Bad_Name' is not a valid DNS-1123 label")
