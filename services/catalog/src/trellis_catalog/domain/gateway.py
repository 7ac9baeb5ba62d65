"""Gateway API routes attached to Services (GAMMA): which rules hold where, in which order,
and each route's status.

:func:`resolve` takes the GRPCRoutes and HTTPRoutes of the spec and the known services and
answers, per parent Service, the rules that apply, one entry per (rule, match, hostname),
sorted by precedence, and per route the ``Accepted`` and ``ResolvedRefs`` conditions of each
Service parent, with the upstream reasons:

- A parent Service that is not known (or a ``port``/``sectionName`` it lacks):
  ``Accepted=False``, ``NoMatchingParent``.
- Route hostnames that intersect none of the parent's names (``svc``, ``svc.ns``,
  ``svc.ns.svc``, ``svc.ns.svc.<domain>``, or a ServiceEntry's hosts):
  ``Accepted=False``, ``NoMatchingListenerHostname``. Otherwise the route holds for the
  intersection only; no hostnames means all of the parent's names.
- A GRPCRoute and an HTTPRoute whose hostnames intersect on the same parent (and port): the
  later one (creation time, then namespace/name) gets ``Accepted=False``,
  ``NotAllowedByListeners`` (GEP-1016; in the mesh the parent Service is the listener).
- Backends: a kind other than Service is ``InvalidKind``; another namespace is
  ``RefNotPermitted`` (ReferenceGrant is not read); an unknown Service or a port it lacks is
  ``BackendNotFound``. ``ResolvedRefs=False`` names each; the backend's share of the traffic
  is answered with an error so the weights hold. An ``ExtensionRef`` filter cannot be
  applied: ``ResolvedRefs=False`` (``InvalidKind``) and its rule answers 500.

Precedence (first match wins in the proxy), GEP-1016 for GRPCRoute: characters of a matching
non-wildcard hostname, then of a matching hostname, of the service, of the method, the
number of header matches; HTTPRoute (upstream): an exact path, then a regex, then the
longest prefix, a method, header matches, query matches. Then, for both, the oldest route
(``metadata.creationTimestamp``, else when the catalog first saw it), namespace/name, and
rule order. A route in another namespace than its parent is a consumer route: it holds only
for clients in its own namespace, and instead of the producer's routes there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from trellis_catalog.domain.gateway_matches import grpc_match, http_match
from trellis_catalog.domain.services import KnownService
from trellis_catalog.domain.spec import Condition, ParentStatus, Status
from trellis_catalog.domain.views import HeaderEdits, HttpMatch, Redirect, Rewrite
from trellis_common.documents import gateway
from trellis_common.documents.base import Document, DocumentKey
from trellis_common.model import MeshService

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
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


@dataclass(frozen=True, slots=True)
class AttachedRule:
    """One match of one rule of one route, as it holds on one parent Service."""

    source: str  # "GRPCRoute ns/name rule 0"
    grpc: bool
    port: int | None  # the parentRef's port; None: every port of the parent
    consumer: str | None  # a consumer route's namespace; None: a producer route
    hostnames: tuple[str, ...]  # the parent's names it holds for; empty: all of them
    precedence: tuple[Any, ...]
    match: HttpMatch
    backends: tuple[Backend, ...]
    mirrors: tuple[MirrorTo, ...] = ()
    request_headers: HeaderEdits | None = None
    response_headers: HeaderEdits | None = None
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    timeout: float | None = None
    backend_timeout: float | None = None
    direct_status: int = 0  # a filter that cannot be applied: 500


@dataclass
class Resolved:
    rules: dict[MeshService, list[AttachedRule]] = field(default_factory=dict)
    statuses: dict[str, Status] = field(default_factory=dict)

    def for_client(self, parent: MeshService, namespace: str) -> list[AttachedRule]:
        """The rules that hold for a client in ``namespace``: its namespace's consumer
        routes when it has any, else the producer's."""
        rules = self.rules.get(parent, [])
        consumer = [r for r in rules if r.consumer == namespace]
        return consumer or [r for r in rules if r.consumer is None]


def service_names(service: MeshService, cluster_domain: str, hosts: Iterable[str]) -> list[str]:
    """The names clients use for a service (without a port)."""
    return list(hosts) or [
        service.name,
        f"{service.name}.{service.namespace}",
        f"{service.name}.{service.namespace}.svc",
        f"{service.name}.{service.namespace}.svc.{cluster_domain}",
    ]


def host_matches(pattern: str, name: str) -> bool:
    """A route hostname (``*.example.com`` matches one or more leading labels) against one
    of the parent's names."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return pattern == name


def _edits(modifier: gateway.HeaderModifier | None) -> HeaderEdits | None:
    if modifier is None:
        return None
    return HeaderEdits(
        set=tuple((h.name, h.value) for h in modifier.set),
        add=tuple((h.name, h.value) for h in modifier.add),
        remove=tuple(modifier.remove),
    )


def _grpc_precedence(match: gateway.GRPCRouteMatch | None) -> tuple[int, ...]:
    method = match.method if match else None
    return (
        -len(method.service or "") if method else 0,
        -len(method.method or "") if method else 0,
        -len(match.effective_headers()) if match else 0,
    )


def _http_precedence(match: gateway.HTTPRouteMatch) -> tuple[int, ...]:
    path = match.path
    rank = {"Exact": 0, "RegularExpression": 1, "PathPrefix": 2}[path.type]
    return (
        rank,
        -len(path.value.rstrip("/") or "/"),
        0 if match.method else 1,
        -len(match.effective_headers()),
        -len(match.effective_query_params()),
    )


class _Refs:
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


def _backend(
    ref: gateway.BackendObjectReference,
    namespace: str,
    services: Mapping[MeshService, KnownService],
    where: str,
    refs: _Refs,
) -> MeshService | None:
    if not ref.is_service:
        refs.add("InvalidKind", f"{where}: {ref.kind} ({ref.group or 'core'}) is not a Service")
        return None
    if ref.namespace and ref.namespace != namespace:
        refs.add(
            "RefNotPermitted",
            f"{where}: Service {ref.namespace}/{ref.name} is in another namespace "
            "(ReferenceGrant is not read: keep backends in the route's namespace)",
        )
        return None
    service = MeshService(namespace, ref.name)
    known = services.get(service)
    if known is None:
        refs.add("BackendNotFound", f"{where}: Service {service} not found")
        return None
    if ref.port not in {p.port for p in known.ports}:
        refs.add("BackendNotFound", f"{where}: Service {service} has no port {ref.port}")
        return None
    return service


@dataclass
class _Attachment:
    route: str
    grpc: bool
    port: int | None
    names: frozenset[str]


def resolve(
    documents: Iterable[Document],
    services: Mapping[MeshService, KnownService],
    first_seen: Mapping[DocumentKey, datetime],
    cluster_domain: str = "cluster.local",
) -> Resolved:
    """Every route's rules on its parents, in precedence order, and every route's status."""
    resolved = Resolved()
    attached: dict[MeshService, list[_Attachment]] = {}

    def created(document: Document) -> datetime:
        stamp: datetime | None = document.resource.metadata.creation_timestamp
        if stamp is not None:
            return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
        return first_seen.get(document.key, EPOCH)

    for document in sorted(documents, key=lambda d: (created(d), d.key.namespace, d.key.name)):
        route = document.resource
        grpc = isinstance(route, gateway.GRPCRoute)
        key = document.key
        refs = _Refs()
        rules = _rules(document, grpc, services, refs)
        parents = []
        for parent_ref in route.spec.parent_refs:
            if not parent_ref.is_service:
                continue  # a Gateway's route: another controller's
            accepted, attachment_rules = _attach(
                document, parent_ref, grpc, rules, services, attached, cluster_domain, created
            )
            parent = MeshService(parent_ref.namespace or key.namespace, parent_ref.name)
            if attachment_rules:
                resolved.rules.setdefault(parent, []).extend(attachment_rules)
            parents.append(
                ParentStatus(
                    group="",
                    kind="Service",
                    namespace=parent.namespace,
                    name=parent.name,
                    port=parent_ref.port,
                    conditions=(accepted, refs.condition()),
                )
            )
        resolved.statuses[str(key)] = _status(document, tuple(parents))
    for attached_rules in resolved.rules.values():
        attached_rules.sort(key=lambda r: r.precedence)
    return resolved


def _status(document: Document, parents: tuple[ParentStatus, ...]) -> Status:
    key = document.key
    base = Status(
        key=str(key),
        kind=key.kind,
        namespace=key.namespace,
        name=key.name,
        state="valid",
        source=document.origin.source,
        document=document.origin.index + 1,
        api_version=document.api_version,
        parents=parents,
    )
    if not parents:
        return _replace(
            base,
            state="ignored",
            reason="no Service parent: it routes no mesh traffic (Trellis applies parentRefs "
            "of kind Service, group \"\"; a Gateway's routes are its controller's); "
            "TrafficTarget rules may still name it",
        )
    problems = [
        f"{p.kind} {p.namespace}/{p.name}: {c.type}={c.status} {c.reason}: {c.message}"
        for p in parents
        for c in p.conditions
        if c.status == "False"
    ]
    accepted = any(
        c.type == "Accepted" and c.status == "True" for p in parents for c in p.conditions
    )
    if not problems:
        return base
    return _replace(base, state="warning" if accepted else "error", reason="; ".join(problems))


def _replace(status: Status, **changes: Any) -> Status:
    return replace(status, **changes)


@dataclass(frozen=True, slots=True)
class _Rule:
    """A rule of a route before it attaches: its matches and what it does."""

    index: int
    matches: tuple[tuple[HttpMatch, tuple[int, ...], str], ...]  # match, precedence, prefix
    backends: tuple[Backend, ...]
    mirrors: tuple[MirrorTo, ...]
    request_headers: HeaderEdits | None
    response_headers: HeaderEdits | None
    redirect: gateway.RequestRedirect | None
    rewrite: gateway.URLRewrite | None
    timeout: float | None
    backend_timeout: float | None
    direct_status: int


def _rules(
    document: Document, grpc: bool, services: Mapping[MeshService, KnownService], refs: _Refs
) -> list[_Rule]:
    route = document.resource
    namespace = document.key.namespace
    found = []
    for index, rule in enumerate(route.spec.rules):
        where = f"spec.rules[{index}]"
        if grpc:
            matches = tuple(
                (grpc_match(m), _grpc_precedence(m), "") for m in rule.matches or (None,)
            )
        else:
            matches = tuple(
                (http_match(m), _http_precedence(m), http_match(m).path_prefix)
                for m in rule.matches
            )
        backends = []
        for b_index, ref in enumerate(rule.backend_refs):
            b_where = f"{where}.backendRefs[{b_index}]"
            service = _backend(ref, namespace, services, b_where, refs)
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
                target = _backend(mirror.backend_ref, namespace, services, f_where, refs)
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
            _Rule(
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


def _filter_edits(filters: Iterable[gateway.HTTPRouteFilter], kind: str) -> HeaderEdits | None:
    for item in filters:
        if item.type == kind:
            return _edits(item.request_header_modifier or item.response_header_modifier)
    return None


def _filter_field(filters: Iterable[gateway.HTTPRouteFilter], name: str) -> Any:
    for item in filters:
        value = getattr(item, name)
        if value is not None:
            return value
    return None


def _attach(
    document: Document,
    parent_ref: gateway.ParentReference,
    grpc: bool,
    rules: list[_Rule],
    services: Mapping[MeshService, KnownService],
    attached: dict[MeshService, list[_Attachment]],
    cluster_domain: str,
    created: Any,
) -> tuple[Condition, list[AttachedRule]]:
    """Attach a route's rules to one Service parent: its Accepted condition and rules."""
    key = document.key
    route = document.resource
    parent = MeshService(parent_ref.namespace or key.namespace, parent_ref.name)
    known = services.get(parent)
    if known is None or known.external:
        return _refused("NoMatchingParent", f"Service {parent} not found"), []
    port = parent_ref.port
    if parent_ref.section_name is not None:
        named = [p.port for p in known.ports if p.name == parent_ref.section_name]
        if not named:
            return _refused(
                "NoMatchingParent",
                f"Service {parent} has no port named {parent_ref.section_name!r}",
            ), []
        port = port or named[0]
    if port is not None and port not in {p.port for p in known.ports}:
        return _refused("NoMatchingParent", f"Service {parent} has no port {port}"), []
    names = service_names(parent, cluster_domain, known.hosts)
    hostnames: list[tuple[str, tuple[str, ...]]] = []  # (route hostname, parent names)
    for pattern in route.spec.hostnames:
        matched = tuple(n for n in names if host_matches(pattern, n))
        if matched:
            hostnames.append((pattern, matched))
    if route.spec.hostnames and not hostnames:
        return _refused(
            "NoMatchingListenerHostname",
            f"none of the hostnames {list(route.spec.hostnames)} is a name of Service {parent} "
            f"({', '.join(names)})",
        ), []
    covered = frozenset(n for _, ns in hostnames for n in ns) if hostnames else frozenset(names)
    mine = _Attachment(str(key), grpc, port, covered)
    for other in attached.get(parent, []):
        if (
            other.grpc != grpc
            and (other.port is None or port is None or other.port == port)
            and other.names & covered
        ):
            return _refused(
                "NotAllowedByListeners",
                f"{other.route} is attached to Service {parent} with intersecting hostnames "
                f"({', '.join(sorted(other.names & covered))}) and is older: a GRPCRoute and an "
                "HTTPRoute cannot share a hostname (GEP-1016)",
            ), []
    attached.setdefault(parent, []).append(mine)
    consumer = key.namespace if key.namespace != parent.namespace else None
    stamp = created(document)
    found = []
    for rule in rules:
        for m_index, (match, specific, prefix) in enumerate(rule.matches):
            for pattern, names_for in hostnames or [("", ())]:
                wildcard = pattern.startswith("*.")
                precedence = (
                    -(0 if wildcard else len(pattern)),
                    -len(pattern),
                    0 if grpc else 1,
                    specific,
                    stamp,
                    key.namespace,
                    key.name,
                    rule.index,
                    m_index,
                )
                found.append(
                    _attached(
                        rule, document, grpc, port, consumer, names_for, precedence, match, prefix
                    )
                )
    return Condition("Accepted", "True", "Accepted", f"attached to Service {parent}"), found


def _attached(
    rule: _Rule,
    document: Document,
    grpc: bool,
    port: int | None,
    consumer: str | None,
    hostnames: tuple[str, ...],
    precedence: tuple[Any, ...],
    match: HttpMatch,
    prefix: str,
) -> AttachedRule:
    redirect = rule.redirect
    rewrite = rule.rewrite
    return AttachedRule(
        source=f"{document.key} rule {rule.index}",
        grpc=grpc,
        port=port,
        consumer=consumer,
        hostnames=hostnames,
        precedence=precedence,
        match=match,
        backends=rule.backends,
        mirrors=rule.mirrors,
        request_headers=rule.request_headers,
        response_headers=rule.response_headers,
        redirect=_redirect(redirect, prefix) if redirect is not None else None,
        rewrite=_rewrite(rewrite, prefix) if rewrite is not None else None,
        timeout=rule.timeout,
        backend_timeout=rule.backend_timeout,
        direct_status=rule.direct_status,
    )


def _redirect(redirect: gateway.RequestRedirect, prefix: str) -> Redirect:
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


def _rewrite(rewrite: gateway.URLRewrite, prefix: str) -> Rewrite:
    path = rewrite.path
    return Rewrite(
        hostname=rewrite.hostname or "",
        full_path=(path.replace_full_path or "") if path else "",
        prefix_path=(path.replace_prefix_match or "") if path else "",
        matched_prefix=prefix or "/",
    )


def _refused(reason: str, message: str) -> Condition:
    return Condition("Accepted", "False", reason, message)
