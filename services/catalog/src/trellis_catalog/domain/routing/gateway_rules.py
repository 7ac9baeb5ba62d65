"""The rules of one Gateway API route before they attach to a parent: matches with their
precedence, backends resolved against the known Services (or why not: the route's
``ResolvedRefs``), mirrors, header modifiers, redirects, rewrites and timeouts.
:mod:`.gateway` attaches them to parents and orders them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trellis_catalog.domain.index.services import KnownService
from trellis_catalog.domain.model.views import HeaderEdits, HttpMatch, Redirect, Rewrite
from trellis_catalog.domain.routing.refgrants import GATEWAY_GROUP, ReferenceGrants
from trellis_common.documents import gateway, gateway_filters
from trellis_common.documents.base import Document
from trellis_common.model import MeshService
from trellis_spec.gateway_matches import grpc_match, http_match
from trellis_spec.statuses import Condition

GRPC_UNAVAILABLE = 503  # Envoy answers a gRPC request's 503 with UNAVAILABLE (14)
HTTP_INVALID = 500
NO_ROUTE = 404  # gRPC: UNIMPLEMENTED (12)


@dataclass(frozen=True, slots=True)
class Backend:
    """A backendRef as the rules use it: a service port, or a problem (an invalid share)."""

    service: MeshService | None
    port: int
    weight: int
    request_headers: HeaderEdits | None = None
    response_headers: HeaderEdits | None = None


@dataclass(frozen=True, slots=True)
class MirrorTo:
    service: MeshService
    port: int
    numerator: int
    denominator: int


def _edits(modifier: gateway_filters.HeaderModifier | None) -> HeaderEdits | None:
    if modifier is None:
        return None
    return HeaderEdits(
        set=tuple((h.name, h.value) for h in modifier.set),
        add=tuple((h.name, h.value) for h in modifier.add),
        remove=tuple(modifier.remove),
    )


def grpc_precedence(match: gateway.GRPCRouteMatch | None) -> tuple[int, ...]:
    method = match.method if match else None
    return (
        -len(method.service or "") if method else 0,
        -len(method.method or "") if method else 0,
        -len(match.effective_headers()) if match else 0,
    )


def http_precedence(match: gateway.HTTPRouteMatch) -> tuple[int, ...]:
    path = match.path
    rank = {"Exact": 0, "RegularExpression": 1, "PathPrefix": 2}[path.type]
    return (
        rank,
        -len(path.value.rstrip("/") or "/"),
        0 if match.method else 1,
        -len(match.effective_headers()),
        -len(match.effective_query_params()),
    )


class Refs:
    """The ResolvedRefs findings of one route."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []  # (reason, message)

    def add(self, reason: str, message: str) -> None:
        self.problems.append((reason, message))

    def condition(self) -> Condition:
        if not self.problems:
            return Condition("ResolvedRefs", "True", "ResolvedRefs", "all references resolved")
        return Condition(
            "ResolvedRefs", "False", self.problems[0][0], "; ".join(m for _, m in self.problems)
        )


def resolve_backend(
    ref: gateway_filters.BackendObjectReference,
    source: tuple[str, str],
    services: Mapping[MeshService, KnownService],
    where: str,
    refs: Refs,
    grants: ReferenceGrants,
) -> MeshService | None:
    """The Service a backendRef of a route (``source``: its kind and namespace) names, if
    it resolves; else why not, in ``refs``."""
    kind, namespace = source
    if not ref.is_service:
        refs.add("InvalidKind", f"{where}: {ref.kind} ({ref.group or 'core'}) is not a Service")
        return None
    target = ref.namespace or namespace
    if not grants.permits((GATEWAY_GROUP, kind, namespace), ("", "Service", target, ref.name)):
        refs.add(
            "RefNotPermitted",
            f"{where}: Service {target}/{ref.name} is in another namespace and no "
            f"ReferenceGrant in {target} lets {kind}s of {namespace} refer to it",
        )
        return None
    service = MeshService(target, ref.name)
    known = services.get(service)
    if known is None:
        refs.add("BackendNotFound", f"{where}: Service {service} not found")
        return None
    if ref.port not in {p.port for p in known.ports}:
        refs.add("BackendNotFound", f"{where}: Service {service} has no port {ref.port}")
        return None
    return service


@dataclass(frozen=True, slots=True)
class Rule:
    """A rule of a route before it attaches: its matches and what it does."""

    index: int
    matches: tuple[tuple[HttpMatch, tuple[int, ...], str], ...]  # match, precedence, prefix
    backends: tuple[Backend, ...]
    mirrors: tuple[MirrorTo, ...]
    request_headers: HeaderEdits | None
    response_headers: HeaderEdits | None
    redirect: gateway_filters.RequestRedirect | None
    rewrite: gateway_filters.URLRewrite | None
    timeout: float | None
    backend_timeout: float | None
    direct_status: int


def route_rules(
    document: Document,
    grpc: bool,
    services: Mapping[MeshService, KnownService],
    refs: Refs,
    grants: ReferenceGrants | None = None,
) -> list[Rule]:
    route = document.resource
    source = (document.key.kind, document.key.namespace)
    grants = grants if grants is not None else ReferenceGrants()
    found = []
    for index, rule in enumerate(route.spec.rules):
        where = f"spec.rules[{index}]"
        if grpc:
            matches = tuple(
                (grpc_match(m), grpc_precedence(m), "") for m in rule.matches or (None,)
            )
        else:
            matches = tuple(
                (http_match(m), http_precedence(m), http_match(m).path_prefix) for m in rule.matches
            )
        backends = []
        for b_index, ref in enumerate(rule.backend_refs):
            b_where = f"{where}.backendRefs[{b_index}]"
            service = resolve_backend(ref, source, services, b_where, refs, grants)
            unsupported = [f.type for f in ref.filters if f.type not in _HEADER_FILTERS]
            if unsupported:
                refs.add(
                    "InvalidKind",
                    f"{b_where}.filters: {', '.join(unsupported)} is not supported on a "
                    "backendRef: this backend's share is answered with an error",
                )
                service = None
            if ref.weight > 0:
                backends.append(
                    Backend(
                        service,
                        ref.port or 0,
                        ref.weight,
                        _filter_edits(ref.filters, "RequestHeaderModifier"),
                        _filter_edits(ref.filters, "ResponseHeaderModifier"),
                    )
                )
        mirrors = []
        direct = 0
        for f_index, item in enumerate(rule.filters):
            if item.type == "RequestMirror" and item.request_mirror is not None:
                mirror = item.request_mirror
                f_where = f"{where}.filters[{f_index}].requestMirror.backendRef"
                target = resolve_backend(
                    mirror.backend_ref, source, services, f_where, refs, grants
                )
                if target is not None:
                    numerator, denominator = mirror.share()
                    mirrors.append(
                        MirrorTo(target, mirror.backend_ref.port or 0, numerator, denominator)
                    )
            elif item.type == "ExtensionRef" and item.extension_ref is not None:
                ext = item.extension_ref
                refs.add(
                    "InvalidKind",
                    f"{where}.filters[{f_index}]: ExtensionRef {ext.kind} {ext.name} "
                    f"({ext.group}) is not a filter Trellis knows: requests matching this "
                    "rule are answered with 500",
                )
                direct = HTTP_INVALID
        timeouts = getattr(rule, "timeouts", None)
        request = timeouts.request_timeout() if timeouts else None
        backend = timeouts.backend_timeout() if timeouts else None
        found.append(
            Rule(
                index=index,
                matches=matches,
                backends=tuple(backends),
                mirrors=tuple(mirrors),
                request_headers=_filter_edits(rule.filters, "RequestHeaderModifier"),
                response_headers=_filter_edits(rule.filters, "ResponseHeaderModifier"),
                redirect=_filter_field(rule.filters, "request_redirect"),
                rewrite=_filter_field(rule.filters, "url_rewrite"),
                timeout=request.total_seconds() if request else None,
                backend_timeout=backend.total_seconds() if backend else None,
                direct_status=direct,
            )
        )
    return found


_HEADER_FILTERS = ("RequestHeaderModifier", "ResponseHeaderModifier")


def _filter_edits(
    filters: Iterable[gateway_filters.HTTPRouteFilter], kind: str
) -> HeaderEdits | None:
    for item in filters:
        if item.type == kind:
            return _edits(item.request_header_modifier or item.response_header_modifier)
    return None


def _filter_field(filters: Iterable[gateway_filters.HTTPRouteFilter], name: str) -> Any:
    for item in filters:
        value = getattr(item, name)
        if value is not None:
            return value
    return None


def redirect_of(redirect: gateway_filters.RequestRedirect, prefix: str) -> Redirect:
    path = redirect.path
    return Redirect(
        scheme=redirect.scheme or "",
        hostname=redirect.hostname or "",
        port=redirect.port or 0,
        status_code=redirect.status_code,
        full_path=(path.replace_full_path or "") if path else "",
        prefix_path=(path.replace_prefix_match or "") if path else "",
        matched_prefix=prefix or "/",
    )


def rewrite_of(rewrite: gateway_filters.URLRewrite, prefix: str) -> Rewrite:
    path = rewrite.path
    return Rewrite(
        hostname=rewrite.hostname or "",
        full_path=(path.replace_full_path or "") if path else "",
        prefix_path=(path.replace_prefix_match or "") if path else "",
        matched_prefix=prefix or "/",
    )
