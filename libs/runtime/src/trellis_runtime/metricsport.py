"""The plain-HTTP metrics port (``--metrics-port``): Prometheus' text, and nothing else.

Kept apart from :mod:`trellis_runtime.admin` (the TLS admin app with its routes and token):
this listener serves no state, takes no body and needs neither TLS nor a token.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send


def metrics_app(registry: CollectorRegistry) -> ASGIApp:
    """The plain-HTTP metrics listener's app (``--metrics-port``): ``GET /metrics`` and
    nothing else, for a Prometheus that holds no mesh certificate (as istiod's 15014). It
    serves no state and takes no body, so it needs neither TLS nor a token; the chart binds
    it to the pod's IP and its NetworkPolicy admits only the namespaces named for scraping."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            status, kind, body = 404, b"text/plain", b"only /metrics is served here\n"
        elif scope["method"] not in ("GET", "HEAD"):
            status, kind, body = 405, b"text/plain", b"GET /metrics\n"
        else:
            status, kind, body = 200, CONTENT_TYPE_LATEST.encode(), generate_latest(registry)
        headers = [(b"content-type", kind), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    return app
