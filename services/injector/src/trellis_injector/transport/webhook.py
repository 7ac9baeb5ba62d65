"""The mutating webhook's HTTP side: ``POST /mutate`` on its own TLS listener (9443).

The API server calls ``https://<service>.<namespace>.svc:443/mutate?timeout=10s`` (the
Service maps 443 to the injector's ``webhook_port``) with an AdmissionReview, and checks
the serving certificate against the configuration's caBundle. The answer is always HTTP
200 with an AdmissionReview, except for a body that is not one: that is 400 with a JSON
``error`` naming what is wrong, logged (``webhook.malformed``) and counted
(``trellis_injector_admission_malformed_total``). A body over :data:`MAX_BODY_BYTES` is 413.
``timeout`` is read as the API server writes it (a Go duration) and bounds the work; an
unreadable one is ignored (the ``webhook_timeout`` setting applies).

The listener is served with the injector's component certificate; its TLS context follows
renewals (new handshakes get the new certificate).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from cryptography import x509
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from trellis_common import admin
from trellis_common.identity import ComponentIdentity
from trellis_injector.domain.admission import MalformedReview, parse_review, parse_timeout
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.sidecars import SidecarInjector

log = logging.getLogger(__name__)

#: A pod can be large (many containers, long env), and the API server caps objects at
#: about 1.5 MiB; anything bigger than this is not a pod's review.
MAX_BODY_BYTES = 4 * 1024 * 1024
PATH = "/mutate"


def _malformed(metrics: InjectorMetrics, reason: str) -> JSONResponse:
    metrics.malformed.inc()
    log.warning("webhook.malformed reason=%r", reason)
    return JSONResponse({"error": f"not an admission.k8s.io/v1 AdmissionReview: {reason}"}, 400)


def create_app(injector: SidecarInjector, metrics: InjectorMetrics) -> FastAPI:
    app = FastAPI(title="trellis injector webhook", openapi_url=None, docs_url=None)
    app.add_middleware(admin.BodyLimit, limit=MAX_BODY_BYTES)

    @app.post(PATH)
    async def mutate(request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return _malformed(metrics, f"the body is not JSON ({exc})")
        try:
            review = parse_review(body)
        except MalformedReview as exc:
            return _malformed(metrics, str(exc))
        timeout = parse_timeout(request.query_params.get("timeout"))
        return await injector.review(review, timeout)

    return app


def names_of(leaf: x509.Certificate) -> list[str]:
    try:
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(sans.value.get_values_for_type(x509.DNSName))


class WebhookServer:
    """The webhook's TLS listener, with the component identity's certificate."""

    def __init__(self, app: FastAPI, identity: ComponentIdentity, host: str, port: int) -> None:
        self._server = admin.AdminServer(app, host, port, ssl_context=identity.server_ssl_context())
        self.host = host

    @staticmethod
    def check_name(identity: ComponentIdentity, service: str) -> None:
        """``ValueError`` unless the serving certificate names ``service`` (the API server
        would refuse the handshake, and every pod with it)."""
        names = names_of(identity.material.leaf)
        if service not in names:
            raise ValueError(
                f"webhook_service {service!r} is not named by the injector's certificate "
                f"(it names {', '.join(names)}): the API server would refuse its TLS"
            )

    @property
    def port(self) -> int:
        """The bound port (0 until the listener is up)."""
        return self._server.port if self._server.started.is_set() else 0

    async def run(self, stop: asyncio.Event) -> None:
        self._server.started.clear()
        self._server.bind()
        log.info("webhook.listening address=%s:%d path=%s", self.host, self._server.port, PATH)
        await self._server.run(stop)


def add_status_route(
    app: FastAPI,
    server: WebhookServer,
    injector: SidecarInjector,
    configuration: str,
    kubernetes: object | None,
) -> None:
    """``GET /v1/webhook`` on the admin API: where the webhook listens and how it decides
    (what ``trellis inject check`` and tests read; no secret in it)."""

    @app.get("/v1/webhook")
    async def status() -> dict[str, Any]:
        return {
            "address": f"{server.host}:{server.port}" if server.port else "",
            "path": PATH,
            "failure_policy": injector.failure_policy,
            "timeout_seconds": injector.timeout,
            "configuration": configuration,
            "kubernetes": kubernetes is not None,
        }
