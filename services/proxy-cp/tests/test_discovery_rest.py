"""The Destination API's admin twin needs the admin token: it answers for any identity."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI

from trellis_identity.tokens import AdminToken
from trellis_proxy_cp.discovery import rest
from trellis_runtime import admin

TOKEN = "an-admin-token"


async def test_the_destination_routes_refuse_a_caller_without_the_admin_token() -> None:
    app = FastAPI()
    nothing: Any = None  # the guard answers before any route reads the table
    rest.add_routes(app, nothing, admin.token_guard(AdminToken.of(TOKEN)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as client:
        for path in (
            "/v1/destinations",
            "/v1/destinations/get?path=web.shop.svc.cluster.local:80",
            "/v1/destinations/profile?path=web.shop.svc.cluster.local:80",
        ):
            assert (await client.get(path)).status_code == 401
            wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 403
