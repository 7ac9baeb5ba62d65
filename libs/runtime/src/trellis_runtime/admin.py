"""Admin REST scaffolding: every service's FastAPI app with health, readiness and metrics.

:func:`create_app` returns an app with ``/healthz`` (the process is alive), ``/readyz``
(every readiness check passes; 503 with the failing checks otherwise; this replica's role in
each leader election, ``roles``, a standby being ready) and ``/metrics``
(Prometheus text from the service's own registry, never a global one). Routes that change
state depend on :func:`token_guard`: a bearer token compared in constant time. Every
request body is capped (:class:`BodyLimit`, 1 MiB by default) before any route reads it.
:class:`AdminServer` runs uvicorn as ``async def run(stop)`` without taking over signals,
bound to 127.0.0.1 unless the service is told otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trellis_common import version
from trellis_identity.tokens import AdminToken
from trellis_runtime.health import Health, Rejections
from trellis_runtime.refusals import RefusalRecorder

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], bool | Awaitable[bool]]

#: The largest request body an admin API accepts, unless ``create_app`` is told otherwise.
MAX_BODY_BYTES = 1024 * 1024

_bearer = HTTPBearer(auto_error=False)


def token_guard(token: AdminToken) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency: 401 without a bearer token, 403 with a wrong one."""

    async def guard(
        credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
    ) -> None:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise HTTPException(
                status_code=401,
                detail="this endpoint changes state: send 'Authorization: Bearer <admin token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not token.matches(credentials.credentials):
            raise HTTPException(status_code=403, detail="admin token rejected")

    return guard


class BodyLimit:
    """Pure ASGI middleware: a request body over ``limit`` bytes is answered 413.

    A ``Content-Length`` over the limit is refused before the app is called at all. A body
    without one (chunked) is counted as the app reads it: once the bytes read pass the
    limit, the 413 is sent, the app is told the client went away (``http.disconnect``, so
    whatever it was parsing fails there) and anything it still sends is dropped. Either way
    no route parses more than ``limit`` bytes. The JSON answer names the limit; the refusal
    is logged and, given ``rejections``, counted and listed (source ``admin-request``, key
    ``METHOD path``). The 413 does not ask for the connection to be closed: uvicorn then
    reads and drops the rest of the body itself, so a client still writing gets the answer
    rather than a reset.
    """

    def __init__(
        self, app: ASGIApp, limit: int = MAX_BODY_BYTES, rejections: Rejections | None = None
    ) -> None:
        self.app = app
        self.limit = limit
        self.rejections = rejections

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, send, f"Content-Length {declared}")
            return
        received = 0
        started = refused = False

        async def limited_receive() -> Message:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    refused = True
                    if not started:
                        await self._refuse(scope, send, f"more than {self.limit} bytes read")
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if refused:
                return  # the 413 went out instead
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not refused:
                raise
            # The app failed on the cut-off body; the client has its 413 already.

    async def _refuse(self, scope: Scope, send: Send, seen: str) -> None:
        reason = f"request body too large: the limit is {self.limit} bytes ({seen})"
        request = f"{scope.get('method', '')} {scope.get('path', '')}"
        log.warning("admin.body_too_large request=%r limit=%d seen=%r", request, self.limit, seen)
        if self.rejections is not None:
            self.rejections.reject("admin-request", request, reason)
        body = json.dumps({"detail": reason, "limit_bytes": self.limit}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server rejects it; the bytes are counted anyway
    return None


#: Admin reads anyone may make: the service's own health, and the mesh's public trust
#: bundle. Every other ``GET /v1/...`` lists identities, certificates, proxies,
#: destinations or workloads, and needs the admin token (:class:`ReadGuard`).
OPEN_READS = frozenset(
    {"/healthz", "/readyz", "/metrics", "/v1/status", "/v1/root", "/v1/root.pem", "/v1/webhook"}
)


class ReadGuard:
    """Pure ASGI middleware: a ``GET``/``HEAD`` of a ``/v1/`` route not in
    :data:`OPEN_READS` needs ``Authorization: Bearer <admin token>`` (401 without one, 403
    with a wrong one, as the mutating routes answer); the refusal is logged and counted by
    the :class:`~trellis_runtime.refusals.RefusalRecorder` around it. The token is asked of
    ``token`` at the first such request (a service loads it only then)."""

    def __init__(self, app: ASGIApp, token: Callable[[], AdminToken]) -> None:
        self.app = app
        self._token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] not in ("GET", "HEAD")
            or not scope["path"].startswith("/v1/")
            or scope["path"] in OPEN_READS
        ):
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            answer = JSONResponse(
                {"detail": "this listing names identities: send 'Authorization: Bearer <admin "
                 "token>'"},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )  # fmt: skip
        elif not self._token().matches(credential.strip()):
            answer = JSONResponse({"detail": "admin token rejected"}, status_code=403)
        else:
            await self.app(scope, receive, send)
            return
        log.warning("admin.read_refused path=%s status=%d", scope["path"], answer.status_code)
        await answer(scope, receive, send)


def create_app(
    title: str,
    registry: CollectorRegistry,
    readiness: Mapping[str, ReadinessCheck] | None = None,
    health: Health | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    *,
    debug_endpoints: bool = False,
    reads_token: Callable[[], AdminToken] | None = None,
) -> FastAPI:
    """The admin app of one service, with the standard endpoints.

    ``/readyz`` fails while a readiness check fails or one of ``health``'s loops is down, and
    says which and why; ``/v1/status`` lists the loops and the rejected records. A request
    body over ``max_body_bytes`` is answered 413 before any route parses it.

    The docs pages and the OpenAPI document (``/docs``, ``/redoc``, ``/openapi.json``) are
    served only with ``debug_endpoints``: they map the API for whoever reaches the port.
    ``app.openapi()`` builds the document in-process either way (the fuzz tests use it).

    With ``reads_token``, listings need the admin token too (:class:`ReadGuard`).
    """
    app = FastAPI(
        title=f"Trellis {title} admin API",
        version="0.1.0",
        docs_url="/docs" if debug_endpoints else None,
        redoc_url="/redoc" if debug_endpoints else None,
        openapi_url="/openapi.json" if debug_endpoints else None,
    )
    checks = dict(readiness or {})
    health = health if health is not None else Health()
    app.add_middleware(BodyLimit, limit=max_body_bytes, rejections=health.rejections)
    if reads_token is not None:
        app.add_middleware(ReadGuard, token=reads_token)
    app.add_middleware(RefusalRecorder, registry=registry)  # outermost: sees every 4xx

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": title}

    @app.get("/readyz", tags=["health"])
    async def readyz() -> JSONResponse:
        results: dict[str, bool] = {}
        for name, check in checks.items():
            try:
                outcome = check()
                results[name] = bool(await outcome) if isinstance(outcome, Awaitable) else outcome
            except Exception:  # a failing check means "not ready", not a crash
                log.exception("admin.readiness_check_failed check=%s", name)
                results[name] = False
        reasons = {name: "check failed" for name, ok in results.items() if not ok}
        for loop in health.loops:
            results[f"loop:{loop.name}"] = loop.is_up
            if not loop.is_up:
                reasons[f"loop:{loop.name}"] = loop.reason
        ready = all(results.values())
        body = {"ready": ready, "service": title, "checks": results, "reasons": reasons}
        roles = health.roles.summary()
        if roles:  # leader or standby: a standby is ready (not leading is not broken)
            body["roles"] = roles
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/v1/status", tags=["health"])
    async def service_status() -> dict[str, Any]:
        """This replica (``instance``), its long-lived loops (up or down, why, restarts),
        records rejected (with reasons) and leader elections (who leads, since when)."""
        return {
            "service": title,
            "instance": health.instance or title,
            "version": version.version(),
            **health.status(),
        }

    @app.get("/metrics", tags=["health"], response_class=PlainTextResponse)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(ValueError)
    async def value_error(_: Request, exc: ValueError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=422)

    _document_error_bodies(app)
    return app


def _document_error_bodies(app: FastAPI) -> None:
    """Say in the OpenAPI document what a 422 carries: ``detail`` is pydantic's list of
    errors for a malformed request, or one sentence naming the field for a refused value
    (the ``ValueError`` handler above, and the services' own handlers)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        error = schema.get("components", {}).get("schemas", {}).get("HTTPValidationError")
        if error is not None and "anyOf" not in error["properties"]["detail"]:
            listed = error["properties"]["detail"]
            error["properties"]["detail"] = {
                "title": "Detail",
                "anyOf": [{"type": "string"}, {k: v for k, v in listed.items() if k != "title"}],
            }
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handling: the service's lifecycle owns SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


#: How long an idle keep-alive connection is kept open. It must outlast the clients' own
#: idle expiry (httpx: 5 s, uvicorn's default here too): when both sides give up at the
#: same moment, a client sends a request on a connection the server is closing, and gets
#: "Server disconnected without sending a response" (the soak saw one in 36,000 POSTs; an
#: agent heartbeating every 5 s would race it all the time). nginx's default, 75 s.
KEEP_ALIVE_SECONDS = 75


class PeerCertificates:
    """The client certificate (DER, or None) of each open connection of a TLS server, by the
    client's address: the TLS layer has it, a request handler looks it up (ASGI scopes do
    not carry it)."""

    def __init__(self) -> None:
        self.by_client: dict[tuple[str, int], bytes | None] = {}

    def protocol(self) -> type[asyncio.Protocol]:
        """uvicorn's HTTP/1.1 protocol, recording each connection's client certificate."""
        from uvicorn.protocols.http.h11_impl import H11Protocol

        peers = self.by_client

        class Recording(H11Protocol):
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(transport)
                tls = transport.get_extra_info("ssl_object")
                if self.client is not None:
                    peers[self.client] = tls.getpeercert(binary_form=True) if tls else None

            def connection_lost(self, exc: Exception | None) -> None:
                if self.client is not None:
                    peers.pop(self.client, None)
                super().connection_lost(exc)

        return Recording


class AdminServer:
    """Serve an ASGI app until ``stop`` is set."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        on_started: Callable[[int], None] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        http_protocol: type[asyncio.Protocol] | None = None,
        *,
        reuse_port: bool = False,
    ) -> None:
        self._app = app
        #: share the port with replicas of the same component (``trellis up --replicas``:
        #: the kernel spreads connections); never for an admin port, which is each one's own
        self._reuse_port = reuse_port
        self._ssl = ssl_context
        #: uvicorn's HTTP protocol class (None: its default)
        self._http = http_protocol
        self._on_started = on_started
        self._host = host
        self._port = port
        self.port = port
        self.started = asyncio.Event()
        self._sock: socket.socket | None = None

    def _context(self, config: Any, default: Any) -> ssl.SSLContext:
        assert self._ssl is not None
        return self._ssl

    @property
    def scheme(self) -> str:
        return "http" if self._ssl is None else "https"

    def bind(self) -> int:
        """Bind now (idempotent) and return the port, e.g. to announce it before serving."""
        if self._sock is None:
            self._sock = self._bind()
        return self.port

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted connections only for
        # sockets made so; without it each reply waits ~40 ms on the client's delayed ACK.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if self._reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self._host, self._port))
        sock.listen(128)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        return sock

    def config(self) -> uvicorn.Config:
        """uvicorn's settings: no access log, no lifespan, and idle keep-alive connections
        kept :data:`KEEP_ALIVE_SECONDS`, longer than clients keep theirs (see there)."""
        return uvicorn.Config(
            self._app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=3,
            timeout_keep_alive=KEEP_ALIVE_SECONDS,
            ssl_context_factory=None if self._ssl is None else self._context,
            http=self._http or "auto",
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.bind()
        sock = self._sock
        assert sock is not None
        server = _QuietServer(self.config())
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():  # noqa: ASYNC110 (uvicorn has no event)
            await asyncio.sleep(0.01)
        if server.started:
            log.info(
                "admin.listening address=%s:%d tls=%s", self._host, self.port, self._ssl is not None
            )
            if self._on_started is not None:
                self._on_started(self.port)
            self.started.set()
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopper}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        stopper.cancel()
        await serving
        sock.close()
        self._sock = None
