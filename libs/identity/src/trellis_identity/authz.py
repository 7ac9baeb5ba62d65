"""Who may call which internal RPC: the control plane's policy, in one table.

Every internal gRPC server requires a client certificate of the mesh CA (TLS refuses any
other before a byte of the request is read). :class:`Authorizer`, a server interceptor,
then checks each call against :data:`POLICY`: the caller's SPIFFE id must name a control
plane component (``spiffe://<td>/ns/trellis-system/sa/<component>``, so a proxy or service
certificate of the same CA is refused), and that component must be in the RPC's cell.
Anything not in the table is refused: a new RPC is closed until someone writes its cell.

``IssueCertificate`` is one RPC with three powers, so its cell depends on the request
(:data:`QUALIFIERS`): a proxy certificate (``[proxy]``, the injector onboarding a proxy),
a service certificate with its key (``[service]``: nobody; every proxy has its own
workload certificate, so a key shared by a whole service leaves certmanager for no one), or
without it (``[service-info]``, the catalog and proxy-cp, which only need to know it).

A caller whose certificate certmanager revoked (:mod:`trellis_runtime.identityrevocation`)
is refused whatever the cell says (reason ``revoked``).

A refusal answers ``PERMISSION_DENIED`` with who was refused what, is logged
(``grpc.refused``) and counted in ``trellis_grpc_refusals_total{method, caller, reason}``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter

from trellis_common.components import (
    CATALOG,
    COMPONENTS,
    INJECTOR,
    PROXY_CP,
    component_of,
)
from trellis_identity.tls import serial_of

log = logging.getLogger(__name__)

_CM = "/trellis.certmanager.v1.CertificateManager/"
_CATALOG = "/trellis.catalog.v1.Catalog/"
_PROVIDER = "/trellis.endpoints.v1.EndpointsProvider/"
_HEALTH = "/grpc.health.v1.Health/"
_REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/"

ANY_COMPONENT = frozenset(COMPONENTS)
NOBODY: frozenset[str] = frozenset()

#: method (or method[qualifier]) -> the components that may call it.
POLICY: Mapping[str, frozenset[str]] = {
    # certmanager
    _CM + "IssueCertificate[proxy]": frozenset({INJECTOR}),
    _CM + "IssueCertificate[service]": NOBODY,  # a service's key: proxies have their own
    _CM + "IssueCertificate[service-info]": frozenset({CATALOG, PROXY_CP}),
    _CM + "GetCertificate": NOBODY,  # returns a key: operators use the admin REST API
    _CM + "RotateCertificate": NOBODY,  # operators: `trellis certs rotate` (REST)
    _CM + "GetRoot": ANY_COMPONENT,
    _CM + "ListCertificates": frozenset({CATALOG}),
    _CM + "GetCertificateInfo": frozenset({CATALOG, PROXY_CP}),
    _CM + "ListRevokedCertificates": frozenset({PROXY_CP}),
    _CM + "RenewComponentCertificate": ANY_COMPONENT,  # for the caller's own identity only
    _CM + "RenewProxyCertificate": frozenset({PROXY_CP}),  # for the proxy proxy-cp authenticated
    _CM + "ListRevokedComponentCertificates": ANY_COMPONENT,  # each refuses revoked callers
    _CM + "EnrollProxy": frozenset({PROXY_CP}),  # a pod's agent, through the enrollment port
    # catalog
    _CATALOG + "ListChanges": frozenset({PROXY_CP}),
    _CATALOG + "WatchChanges": frozenset({PROXY_CP}),
    _CATALOG + "GetResources": frozenset({PROXY_CP}),
    _CATALOG + "GetView": frozenset({PROXY_CP}),
    _CATALOG + "ListServices": frozenset({PROXY_CP}),
    _CATALOG + "CheckPolicy": frozenset({PROXY_CP}),
    _CATALOG + "ExpectProxy": frozenset({INJECTOR, PROXY_CP}),  # onboarding; enrollment
    _CATALOG + "RegisterProxy": frozenset({PROXY_CP}),
    _CATALOG + "UnregisterProxy": frozenset({PROXY_CP}),
    _CATALOG + "ListProxies": frozenset({PROXY_CP}),
    _CATALOG + "GetSidecarSettings": frozenset({INJECTOR}),
    # endpoints providers (endpoints-vm, endpoints-k8s)
    _PROVIDER + "ListServices": frozenset({CATALOG}),
    _PROVIDER + "GetService": frozenset({CATALOG}),
    _PROVIDER + "WatchServices": frozenset({CATALOG}),
    # every server
    _HEALTH + "Check": ANY_COMPONENT,
    _HEALTH + "Watch": ANY_COMPONENT,
    _REFLECTION + "ServerReflectionInfo": ANY_COMPONENT,  # served only with debug_endpoints
}


#: What a caller whose certificate was revoked may still call: the list that tells it so
#: (it then exits to join again; the list holds serials and names, nothing secret).
REVOKED_MAY_CALL = frozenset({_CM + "ListRevokedComponentCertificates"})


def _issue_power(request: Any) -> str:
    if request.kind == 2:  # CERTIFICATE_KIND_PROXY
        return "proxy"
    return "service-info" if request.omit_private_key else "service"


#: method -> what names the cell from the request (unary requests only).
QUALIFIERS: Mapping[str, Callable[[Any], str]] = {_CM + "IssueCertificate": _issue_power}


def cell(method: str, request: Any = None) -> str:
    qualify = QUALIFIERS.get(method)
    return method if qualify is None or request is None else f"{method}[{qualify(request)}]"


def allowed(cell_name: str, component: str | None) -> bool:
    return component is not None and component in POLICY.get(cell_name, NOBODY)


def caller(context: grpc.aio.ServicerContext[Any, Any], trust_domain: str) -> tuple[str, str]:
    """(the caller's SPIFFE id or ``-``, its component or ``""``)."""
    auth = context.auth_context()
    ids = list(auth.get("peer_spiffe_id") or ())
    uri = ids[0].decode() if ids else ""
    return uri or "-", component_of(uri, trust_domain) or ""


Behavior = Callable[..., Any]


class Authorizer(grpc.aio.ServerInterceptor):
    """Checks every call against :data:`POLICY` (see the module docstring)."""

    def __init__(
        self,
        trust_domain: str,
        registry: CollectorRegistry,
        revoked: Callable[[str], bool] | None = None,
    ) -> None:
        self._trust_domain = trust_domain
        #: serial (lowercase hex) -> whether certmanager revoked that component certificate
        self._revoked = revoked
        self.refusals = Counter(
            "trellis_grpc_refusals",
            "Internal gRPC calls refused by the component policy, by method, caller and reason",
            ["method", "caller", "reason"],
            registry=registry,
        )

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._streaming(method, handler.stream_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._streaming(method, handler.stream_stream),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    async def check(
        self, context: grpc.aio.ServicerContext[Any, Any], method: str, request: Any = None
    ) -> None:
        """Abort the call with PERMISSION_DENIED unless the caller's cell allows it."""
        uri, component = caller(context, self._trust_domain)
        name = cell(method, request)
        exempt = self._revoked is None or method in REVOKED_MAY_CALL
        serial = "" if exempt else self._serial(context)
        if serial and self._revoked is not None and self._revoked(serial):
            reason = "revoked"
            detail = f"the certificate {serial} of {component or uri} was revoked"
        elif allowed(name, component):
            return
        elif not component:
            reason = "not_a_component"
            detail = f"{uri} is not a control plane identity of {self._trust_domain}"
        else:
            reason = "not_in_policy"
            who = ", ".join(sorted(POLICY.get(name, NOBODY))) or "no component"
            detail = f"{component} may not call {name} (allowed: {who})"
        self.refusals.labels(method, component or "-", reason).inc()
        log.warning(
            "grpc.refused method=%s caller=%s reason=%s peer=%s",
            name,
            uri,
            reason,
            context.peer(),
        )
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, detail)

    @staticmethod
    def _serial(context: grpc.aio.ServicerContext[Any, Any]) -> str:
        pems = list(context.auth_context().get("x509_pem_cert") or ())
        return serial_of(pems[0]) if pems else ""

    def _unary(self, method: str, behavior: Behavior) -> Behavior:
        async def checked(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await self.check(context, method, request)
            return await behavior(request, context)

        return checked

    def _unary_stream(self, method: str, behavior: Behavior) -> Behavior:
        if inspect.isasyncgenfunction(behavior):

            async def generated(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await self.check(context, method, request)
                async for item in behavior(request, context):
                    yield item

            return generated
        return self._unary(method, behavior)  # it writes its answers with context.write

    def _streaming(self, method: str, behavior: Behavior) -> Behavior:
        if inspect.isasyncgenfunction(behavior):

            async def generated(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await self.check(context, method)
                async for item in behavior(requests, context):
                    yield item

            return generated

        async def checked(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await self.check(context, method)
            return await behavior(requests, context)

        return checked
