"""Checking internal gRPC requests where they enter a service, and refusing bad ones.

Every internal API (certmanager, endpoints-vm, catalog) takes names from its callers:
namespaces, service names, service accounts, common names. A wrong one must be refused at
the door, because once stored it fails later and elsewhere: a proxy certificate issued for
the service account ``Bad Name!`` was stored durably by certmanager and then crash-looped
the catalog, which builds SPIFFE ids from it.

So each service keeps, beside its servicer, one pure function per RPC that turns a request
into checked values or raises :class:`InvalidField`. The functions here are the shared
rules: the identifier rules of :mod:`trellis_common.ids`, reported under the request
field's own name as the ``.proto`` spells it (``service.namespace``, ``common_name``), so a
caller reads ``service_account: 'Bad Name!' is not a valid DNS-1123 subdomain: ...``.

:class:`RequestGate` refuses: it records the rejection in the service's
:class:`~trellis_runtime.health.Rejections` under source ``grpc`` and the RPC's name (logged
once per reason, counted in ``trellis_rejected_records_total{source="grpc"}``, shown by
``/v1/status``), then aborts the call with INVALID_ARGUMENT and the same message. A refused
call is not a record that can become valid later, so nothing here ever ``accept``\\ s.

:func:`rpc` is how a servicer method says what is its own: which check its request takes,
and which domain errors end the call with which status (certmanager's ``NotFound`` is
NOT_FOUND). The method then receives checked values, never the raw request, and the
"check, refuse, call, map the error" plumbing is written once, here.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Final, NoReturn, Protocol, TypeVar

import grpc

from trellis_common import ids
from trellis_runtime.health import Rejections

SOURCE: Final = "grpc"
#: Longest value quoted back in a message: a caller's 10 kB of junk is not echoed whole.
MAX_QUOTED: Final = 80
#: Longest free-text field (instance names, addresses): a DNS name's limit.
MAX_TEXT: Final = 253

Request = TypeVar("Request")
Checked = TypeVar("Checked")
Answer = TypeVar("Answer")
Context = grpc.aio.ServicerContext[Any, Any]


def quoted(value: object) -> str:
    """``repr(value)``, cut to :data:`MAX_QUOTED` characters."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTED else text[: MAX_QUOTED - 5] + "...'"


class InvalidField(ValueError):
    """A request field is not acceptable: ``field`` is its path in the request message."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")

    def __reduce__(self) -> tuple[type[InvalidField], tuple[str, str]]:
        return type(self), (self.field, self.reason)


def _from_identifier(field: str, exc: ids.InvalidIdentifier) -> InvalidField:
    return InvalidField(field, f"{quoted(exc.value)} is not a valid {exc.kind}: {exc.reason}")


def required(field: str, value: str) -> str:
    if not value:
        raise InvalidField(field, "is required")
    return value


def dns_label(field: str, value: str, *, optional: bool = False) -> str:
    """A namespace or service name (RFC 1123 label); ``optional`` lets ``""`` through."""
    if optional and not value:
        return value
    try:
        return ids.validate_dns_label(required(field, value), field)
    except ids.InvalidIdentifier as exc:
        raise _from_identifier(field, exc) from None


def dns_subdomain(field: str, value: str, *, optional: bool = False) -> str:
    """A service account or object name (RFC 1123 subdomain); ``optional`` lets ``""`` through."""
    if optional and not value:
        return value
    try:
        return ids.validate_dns_subdomain(required(field, value), field)
    except ids.InvalidIdentifier as exc:
        raise _from_identifier(field, exc) from None


def service_account(field: str, value: str, *, optional: bool = True) -> str:
    """A service account name; empty (the default: the service's name) unless required."""
    return dns_subdomain(field, value, optional=optional)


def proxy_id(field: str, value: str, *, optional: bool = False) -> str:
    """A proxy's UUID in canonical form; ``optional`` lets ``""`` (make one) through."""
    if optional and not value:
        return value
    try:
        return ids.validate_proxy_id(required(field, value), field)
    except ids.InvalidIdentifier as exc:
        raise _from_identifier(field, exc) from None


def proxy_common_name(field: str, value: str) -> ids.ProxyCommonName:
    """A proxy certificate's CN, ``<proxy-uuid>.<service>.<namespace>``."""
    try:
        return ids.ProxyCommonName.parse(required(field, value))
    except ids.InvalidIdentifier as exc:
        raise _from_identifier(field, exc) from None


def common_name(field: str, value: str) -> ids.ProxyCommonName | ids.ServiceCommonName:
    """A certificate's CN: a proxy's (three labels) or a service's (``...svc.<domain>``)."""
    required(field, value)
    if len(value) > ids.MAX_COMMON_NAME_LENGTH:
        reason = (
            f"must be no more than {ids.MAX_COMMON_NAME_LENGTH} characters (X.509 "
            f"ub-common-name), got {len(value)}"
        )
        raise InvalidField(field, reason)
    parts = value.split(".")
    try:
        if len(parts) > 3 and parts[2] == "svc":
            return ids.ServiceCommonName.parse(value)
        if len(parts) == 3:
            return ids.ProxyCommonName.parse(value)
    except ids.InvalidIdentifier as exc:
        raise _from_identifier(field, exc) from None
    shapes = "'<proxy-uuid>.<service>.<namespace>' or '<service>.<namespace>.svc.<trust-domain>'"
    raise InvalidField(field, f"{quoted(value)} is not a certificate common name: must be {shapes}")


def namespaced(field: str, value: str) -> tuple[str, str]:
    """``<namespace>/<name>``, both DNS labels (an identity, a service)."""
    namespace, slash, name = required(field, value).partition("/")
    if not slash or "/" in name:
        raise InvalidField(field, f"must be '<namespace>/<name>', got {quoted(value)}")
    return dns_label(field, namespace), dns_label(field, name)


def enum(field: str, value: int, allowed: Mapping[int, str]) -> int:
    """An enum number ``allowed`` names (proto3 enums are open: any int32 arrives)."""
    if value not in allowed:
        names = ", ".join(allowed.values())
        raise InvalidField(field, f"must be one of {names}, got {value}")
    return value


def ip_address(field: str, value: str, *, optional: bool = False) -> str:
    """An IPv4 or IPv6 address, as text; ``optional`` lets ``""`` (unknown) through."""
    if optional and not value:
        return value
    try:
        return str(ipaddress.ip_address(required(field, value)))
    except ValueError:
        raise InvalidField(field, f"must be an IP address, got {quoted(value)}") from None


def text(field: str, value: str, *, optional: bool = False, max_length: int = MAX_TEXT) -> str:
    """A free-form name (an instance name): printable, no spaces, at most ``max_length``."""
    if optional and not value:
        return value
    required(field, value)
    if len(value) > max_length:
        raise InvalidField(field, f"must be no more than {max_length} characters, got {len(value)}")
    if not value.isprintable() or any(c.isspace() for c in value):
        raise InvalidField(field, f"must be printable with no spaces, got {quoted(value)}")
    return value


class RequestGate:
    """Refuses requests for one servicer: counted, kept for status, then aborted."""

    def __init__(self, rejections: Rejections | None = None) -> None:
        self.rejections = rejections if rejections is not None else Rejections()

    async def refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], rpc: str, error: Exception
    ) -> NoReturn:
        """Record ``error`` against ``rpc`` and end the call with INVALID_ARGUMENT."""
        reason = str(error)
        self.rejections.reject(SOURCE, rpc, reason)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, reason)

    async def check(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        rpc: str,
        check: Callable[[Request], Checked],
        request: Request,
        errors: tuple[type[Exception], ...] = (InvalidField,),
    ) -> Checked:
        """``check(request)``'s checked values, or the call refused with what was wrong.

        Every RPC that takes names from its caller opens this way; ``errors`` widens what
        counts as a bad request (a domain's own ``InvalidRequest``) when the check calls
        into the domain.
        """
        try:
            return check(request)
        except errors as exc:
            await self.refuse(context, rpc, exc)


class Gated(Protocol):
    """A servicer whose RPCs are checked: it refuses bad requests through ``gate``."""

    @property
    def gate(self) -> RequestGate: ...


Servicer = TypeVar("Servicer", bound=Gated)
Method = Callable[[Servicer, Checked, Context], Awaitable[Answer]]
Rpc = Callable[[Servicer, Request, Context], Coroutine[Any, Any, Answer]]


def rpc(
    check: Callable[[Request], Checked],
    *,
    refused: tuple[type[Exception], ...] = (InvalidField,),
    statuses: Mapping[type[Exception], grpc.StatusCode] | None = None,
) -> Callable[[Method[Servicer, Checked, Answer]], Rpc[Servicer, Request, Answer]]:
    """Make a servicer method of one taking ``check(request)``'s values.

    A request the check refuses (:class:`InvalidField`), or an error in ``refused`` that
    the method raises (InvalidField again, or a domain's own ``InvalidRequest``), is
    refused through the servicer's gate under the method's name; an error in ``statuses``
    ends the call with its code and message. Anything else propagates: grpc makes it UNKNOWN.
    """
    codes = dict(statuses or {})

    def decorate(method: Method[Servicer, Checked, Answer]) -> Rpc[Servicer, Request, Answer]:
        name = method.__name__

        @functools.wraps(method)
        async def answer(self: Servicer, request: Request, context: Context) -> Answer:
            checked = await self.gate.check(context, name, check, request)
            try:
                return await method(self, checked, context)
            except refused as exc:
                await self.gate.refuse(context, name, exc)
            except tuple(codes) as exc:
                code = next(c for kind, c in codes.items() if isinstance(exc, kind))
                await context.abort(code, str(exc))

        return answer

    return decorate
