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

**Who may call it.** With ``webhook_client_ca`` set, ``/mutate`` answers only the API
server: a caller must present a client certificate that CA signed (the API server's, given
to it through its admission configuration, ``docs/injection.md``) naming one of
``webhook_client_names`` (any, when empty). A certificate of another CA fails the TLS
handshake; a caller with none, or with one that names someone else, gets 403 naming why,
logged (``webhook.refused``) and counted (``trellis_injector_webhook_refused_total{reason}``:
``no_client_certificate``, ``unexpected_client``). Without it, only the chart's
NetworkPolicy stands between a pod and the webhook (``docs/security.md`` says what that
leaves open); the webhook has no side effects either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from pathlib import Path
from typing import Any

from cryptography import x509
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from trellis_identity.identity import ComponentIdentity
from trellis_injector.domain.admission import MalformedReview, parse_review, parse_timeout
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.sidecars import SidecarInjector
from trellis_runtime import admin

log = logging.getLogger(__name__)

#: A pod can be large (many containers, long env), and the API server caps objects at
#: about 1.5 MiB; anything bigger than this is not a pod's review.
MAX_BODY_BYTES = 4 * 1024 * 1024
PATH = "/mutate"


def _malformed(metrics: InjectorMetrics, reason: str) -> JSONResponse:
    metrics.malformed.inc()
    log.warning("webhook.malformed reason=%r", reason)
    return JSONResponse({"error": f"not an admission.k8s.io/v1 AdmissionReview: {reason}"}, 400)


class CallerCheck:
    """Who may call ``/mutate``: see the module docstring."""

    def __init__(self, ca_file: Path, names: frozenset[str]) -> None:
        self.ca_file = ca_file
        self.names = names
        self.peers = admin.PeerCertificates()

    def configure(self, context: ssl.SSLContext) -> None:
        # OPTIONAL, not REQUIRED: a caller without a certificate reaches the handler, to be
        # refused by name and counted; one from another CA still fails the handshake
        context.load_verify_locations(cafile=str(self.ca_file))
        context.verify_mode = ssl.CERT_OPTIONAL

    def refusal(self, client: tuple[str, int] | None) -> tuple[str, str] | None:
        """(reason, message) when this client may not call, else None."""
        der = self.peers.by_client.get(client) if client is not None else None
        if der is None:
            return "no_client_certificate", "a client certificate of the API server is required"
        if not self.names:
            return None
        leaf = x509.load_der_x509_certificate(der)
        common = [
            str(a.value) for a in leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
        ]
        presented = set(common) | set(names_of(leaf))
        if presented & self.names:
            return None
        return "unexpected_client", (
            f"the client certificate names {', '.join(sorted(presented)) or 'nobody'}, not "
            f"{', '.join(sorted(self.names))}"
        )


def create_app(
    injector: SidecarInjector, metrics: InjectorMetrics, callers: CallerCheck | None = None
) -> FastAPI:
    app = FastAPI(title="trellis injector webhook", openapi_url=None, docs_url=None)
    app.add_middleware(admin.BodyLimit, limit=MAX_BODY_BYTES)

    @app.post(PATH)
    async def mutate(request: Request) -> Any:
        if callers is not None:
            client = (request.client.host, request.client.port) if request.client else None
            refused = callers.refusal(client)
            if refused is not None:
                reason, message = refused
                metrics.webhook_refused.labels(reason).inc()
                log.warning(
                    "webhook.refused reason=%s client=%s detail=%r", reason, client, message
                )
                return JSONResponse({"error": f"not the API server: {message}"}, 403)
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

    def __init__(
        self,
        app: FastAPI,
        identity: ComponentIdentity,
        host: str,
        port: int,
        callers: CallerCheck | None = None,
    ) -> None:
        context = identity.server_ssl_context()
        protocol = None
        if callers is not None:
            callers.configure(context)
            protocol = callers.peers.protocol()
        # replicas share the webhook port locally (SO_REUSEPORT), as behind a Service
        self._server = admin.AdminServer(
            app, host, port, ssl_context=context, http_protocol=protocol, reuse_port=True
        )
        self.host = host
        self.callers = callers

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
