"""Every refused admin request is logged and counted.

A 4xx answer from a service's admin REST API is a refusal: a missing or wrong token (401,
403), an unknown record (404), a body that is too large (413) or invalid (400, 422). An
operator (or an alarm) must see them without reading each service's code, so one ASGI
middleware logs each with the route that refused it, and counts it in
``trellis_http_refusals_total{method, route, status}``. The route is the path template
(``/v1/workloads/{namespace}/{name}``), never the raw path, so the metric's cardinality
stays bounded whatever a caller sends.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class RefusalRecorder:
    """Logs and counts the 4xx answers of ``app``; see the module docstring."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry) -> None:
        self.app = app
        self.refusals = Counter(
            "trellis_http_refusals",
            "Admin API requests refused (4xx), by method, route template and status",
            ["method", "route", "status"],
            registry=registry,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def recording(message: Message) -> None:
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                self._record(scope, message["status"])
            await send(message)

        await self.app(scope, receive, recording)

    def _record(self, scope: Scope, status: int) -> None:
        method, route = scope.get("method", ""), _route(scope)
        self.refusals.labels(method, route, str(status)).inc()
        peer = scope.get("client")
        log.info(
            "http.refused method=%s route=%s status=%d peer=%s",
            method,
            route,
            status,
            f"{peer[0]}:{peer[1]}" if peer else "-",
        )


def _route(scope: Scope) -> str:
    """The path template that matched, or ``unmatched`` (never the raw path)."""
    app: Any = scope.get("app")
    router = getattr(app, "router", None)
    for route in getattr(router, "routes", ()):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", "unmatched"))
    return "unmatched"
