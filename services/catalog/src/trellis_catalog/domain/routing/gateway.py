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
from typing import Any, Protocol

from trellis_catalog.domain.index.services import KnownService
from trellis_catalog.domain.model.views import HeaderEdits, HttpMatch, Redirect, Rewrite
from trellis_catalog.domain.routing.gateway_rules import (
    Backend,
    MirrorTo,
    Refs,
    Rule,
    redirect_of,
    rewrite_of,
    route_rules,
)
from trellis_catalog.domain.routing.refgrants import ReferenceGrants
from trellis_common.documents import gateway
from trellis_common.documents.base import Document, DocumentKey
from trellis_common.model import MeshService
from trellis_spec.statuses import Condition, ParentStatus, Status

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


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


def hostnames(
    service: MeshService, port: int, cluster_domain: str, hosts: tuple[str, ...]
) -> tuple[str, ...]:
    """Every name a client may use for ``service`` on ``port``: each name, then each with
    the port."""
    names = service_names(service, cluster_domain, hosts)
    return tuple(names + [f"{name}:{port}" for name in names])


def host_matches(pattern: str, name: str) -> bool:
    """A route hostname (``*.example.com`` matches one or more leading labels) against one
    of the parent's names."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:]) and len(name) > len(pattern) - 1
    return pattern == name


@dataclass
class _Attachment:
    route: str
    grpc: bool
    port: int | None
    names: frozenset[str]


class GatewayParents(Protocol):
    """Trellis' Gateways, as routes attach to them (:class:`~.gateways.Gateways`)."""

    @property
    def grants(self) -> ReferenceGrants: ...

    def route_parents(
        self, document: Document, grpc: bool, rules: list[Rule], refs: Refs, created: datetime
    ) -> list[ParentStatus]: ...


def resolve(
    documents: Iterable[Document],
    services: Mapping[MeshService, KnownService],
    first_seen: Mapping[DocumentKey, datetime],
    cluster_domain: str = "cluster.local",
    gateways: GatewayParents | None = None,
) -> Resolved:
    """Every route's rules on its parents, in precedence order, and every route's status
    (with its parents that are Trellis' Gateways, when ``gateways`` are given: they attach
    there)."""
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
        refs = Refs()
        rules = route_rules(document, grpc, services, refs, gateways.grants if gateways else None)
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
        if gateways is not None:
            parents += gateways.route_parents(document, grpc, rules, refs, created(document))
        resolved.statuses[str(key)] = route_status(document, tuple(parents))
    for attached_rules in resolved.rules.values():
        attached_rules.sort(key=lambda r: r.precedence)
    return resolved


def route_status(document: Document, parents: tuple[ParentStatus, ...]) -> Status:
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
            reason="no Service parent and no Gateway of Trellis' GatewayClass: it routes no "
            'traffic (Trellis applies parentRefs of kind Service, group "", and of its own '
            "Gateways; another Gateway's routes are its controller's); TrafficTarget rules may "
            "still name it",
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


def _attach(
    document: Document,
    parent_ref: gateway.ParentReference,
    grpc: bool,
    rules: list[Rule],
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
                    attached_rule(
                        rule, document, grpc, port, consumer, names_for, precedence, match, prefix
                    )
                )
    return Condition("Accepted", "True", "Accepted", f"attached to Service {parent}"), found


def attached_rule(
    rule: Rule,
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
        redirect=redirect_of(redirect, prefix) if redirect is not None else None,
        rewrite=rewrite_of(rewrite, prefix) if rewrite is not None else None,
        timeout=rule.timeout,
        backend_timeout=rule.backend_timeout,
        direct_status=rule.direct_status,
    )


def _refused(reason: str, message: str) -> Condition:
    return Condition("Accepted", "False", reason, message)
