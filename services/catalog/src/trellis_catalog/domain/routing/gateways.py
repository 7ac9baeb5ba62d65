"""Gateways of Trellis' GatewayClass: their listeners, the routes attached to them, and the
status of each (north-south traffic; :mod:`.gateway` is the mesh's, GAMMA).

A GatewayClass whose ``controllerName`` is ``trellis.dev/gateway`` is Trellis'; each Gateway
of it is served by a gateway Envoy running as the identity ``<namespace>/<gateway>``
(:mod:`.gatewayports` builds what that identity's view holds). :func:`resolve` answers:

- **Listeners** (:mod:`.gateway_listeners`): which are served (HTTP, and HTTPS terminated with
  certificates from Secrets), which are not and why (``UnsupportedProtocol``, a
  ``ProtocolConflict`` on a port, ``InvalidCertificateRef``/``RefNotPermitted``,
  ``InvalidRouteKinds``).
- **Attachment**: a route's Gateway parentRef (with ``sectionName`` and ``port``, if set)
  attaches to each matching listener that allows the route's kind and namespace
  (``allowedRoutes``) and whose hostname intersects the route's hostnames. Otherwise its
  ``Accepted`` is False with ``NoMatchingParent``, ``NotAllowedByListeners`` or
  ``NoMatchingListenerHostname``. A GRPCRoute and an HTTPRoute whose hostnames intersect on
  one listener cannot both attach: the later one is not accepted (GEP-1016).
- **Host names**: the route holds on a listener for the intersection of its hostnames and
  the listener's; a request belongs to the most specific listener on its port whose
  hostname matches it (listener isolation), and within it to the most specific route
  hostname, falling through to less specific ones (:mod:`.gatewayports`).
- **Status**: the GatewayClass's ``Accepted`` and ``SupportedVersion``; the Gateway's
  ``Accepted`` and ``Programmed``; each listener's ``Accepted``, ``Programmed``,
  ``ResolvedRefs``, ``Conflicted``, ``supportedKinds`` and ``attachedRoutes``; each route's
  ``Accepted`` and ``ResolvedRefs`` per Gateway parent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from trellis_catalog.domain.model.views import Identity
from trellis_catalog.domain.routing.gateway import AttachedRule, attached_rule
from trellis_catalog.domain.routing.gateway_listeners import GatewayListener, listeners_of
from trellis_catalog.domain.routing.gateway_rules import Backend, Refs, Rule
from trellis_catalog.domain.routing.refgrants import GATEWAY_GROUP, ReferenceGrants
from trellis_common.documents import gateway, gateway_api
from trellis_common.documents.base import Document
from trellis_spec.mesh import MeshSpec
from trellis_spec.statuses import Condition, ParentStatus, Status


@dataclass(frozen=True, slots=True)
class GatewayRule:
    """One match of one rule of a route, attached to one listener."""

    source: str  # "HTTPRoute ns/name rule 0"
    route: str  # "HTTPRoute ns/name"
    grpc: bool
    domains: tuple[str, ...]  # the listener's and route's names intersected ("*": any)
    precedence: tuple[Any, ...]
    match_index: int
    attached: AttachedRule  # what it does, as a mesh route's rule


@dataclass(frozen=True, slots=True)
class TlsRule:
    """A TLSRoute on one passthrough listener: its server names there and its backends."""

    source: str  # "TLSRoute ns/name"
    domains: tuple[str, ...]
    backends: tuple[Backend, ...]
    created: datetime


@dataclass
class ServedGateway:
    """A Gateway of Trellis' class: its listeners and the rules attached to each."""

    namespace: str
    name: str
    listeners: list[GatewayListener]
    rules: dict[str, list[GatewayRule]] = field(default_factory=dict)  # by listener name
    tls_rules: dict[str, list[TlsRule]] = field(default_factory=dict)  # TLSRoutes, by listener
    routes: dict[str, set[str]] = field(default_factory=dict)  # listener -> routes attached


@dataclass
class Gateways:
    served: dict[Identity, ServedGateway] = field(default_factory=dict)
    statuses: dict[str, Status] = field(default_factory=dict)  # GatewayClass, Gateway
    grants: ReferenceGrants = field(default_factory=ReferenceGrants)

    def route_parents(
        self,
        document: Document,
        grpc: bool,
        rules: list[Rule],
        refs: Refs,
        created: datetime,
    ) -> list[ParentStatus]:
        """Attach a route to its parents that are Trellis' Gateways; their statuses."""
        found = []
        route = document.resource
        for parent_ref in route.spec.parent_refs:
            if parent_ref.group != GATEWAY_GROUP or parent_ref.kind != "Gateway":
                continue
            namespace = parent_ref.namespace or document.key.namespace
            served = self.served.get(Identity(namespace, parent_ref.name))
            if served is None:
                continue  # not ours (or not there): another controller's business
            accepted = _attach(served, document, parent_ref, grpc, rules, created)
            found.append(gateway_parent(parent_ref, namespace, (accepted, refs.condition())))
        return found


def gateway_parent(
    parent_ref: gateway.ParentReference, namespace: str, conditions: tuple[Condition, ...]
) -> ParentStatus:
    """A route's status entry for one of Trellis' Gateways."""
    return ParentStatus(
        group=GATEWAY_GROUP,
        kind="Gateway",
        namespace=namespace,
        name=parent_ref.name,
        port=parent_ref.port,
        conditions=conditions,
        section_name=parent_ref.section_name,
    )


def resolve(
    classes: list[Document],
    gateway_documents: list[Document],
    grant_documents: list[Document],
    namespace_labels: Mapping[str, Mapping[str, str]],
) -> Gateways:
    """The Gateways of Trellis' classes, before routes attach (they do in
    :func:`~.gateway.resolve`, through :meth:`Gateways.route_parents`)."""
    resolved = Gateways(grants=ReferenceGrants(grant_documents))
    ours: set[str] = set()
    for document in classes:
        spec = document.resource.spec
        if spec.controller_name != gateway_api.CONTROLLER:
            resolved.statuses[str(document.key)] = _ignored(
                document, f"controllerName {spec.controller_name}: another controller's class"
            )
            continue
        ours.add(document.key.name)
        resolved.statuses[str(document.key)] = _class_status(document)
    for document in gateway_documents:
        spec = document.resource.spec
        if spec.gateway_class_name not in ours:
            resolved.statuses[str(document.key)] = _ignored(
                document,
                f"GatewayClass {spec.gateway_class_name} is not Trellis' (controllerName "
                f"{gateway_api.CONTROLLER}), or does not exist",
            )
            continue
        listeners = listeners_of(document, resolved.grants, namespace_labels)
        key = document.key
        resolved.served[Identity(key.namespace, key.name)] = ServedGateway(
            key.namespace, key.name, listeners
        )
    return resolved


def resolve_gateways(spec: MeshSpec) -> Gateways:
    """:func:`resolve` over a spec's documents."""
    return resolve(
        spec.gateway_classes, spec.gateways, spec.reference_grants, spec.namespace_labels
    )


def statuses(resolved: Gateways, documents: list[Document]) -> dict[str, Status]:
    """Every Gateway's status once routes attached (attachedRoutes counts them)."""
    found = dict(resolved.statuses)
    for document in documents:
        key = document.key
        served = resolved.served.get(Identity(key.namespace, key.name))
        if served is not None:
            found[str(key)] = _gateway_status(document, served)
    return found


Attach = Callable[[GatewayListener, tuple[str, ...]], "str | None"]


def attach(
    served: ServedGateway,
    document: Document,
    parent_ref: gateway.ParentReference,
    take: Attach,
) -> Condition:
    """Attach a route to the listeners of ``served`` its parentRef names, that admit it and
    whose hostname intersects its own: ``take(listener, names)`` records it on one (or
    answers why it may not); the route's Accepted condition for this parent."""
    key = document.key
    route = document.resource
    where = f"Gateway {served.namespace}/{served.name}"
    candidates = [
        listener
        for listener in served.listeners
        if (parent_ref.section_name is None or listener.name == parent_ref.section_name)
        and (parent_ref.port is None or listener.port == parent_ref.port)
    ]
    if not candidates:
        wanted = " ".join(
            part
            for part in (
                f"listener {parent_ref.section_name!r}" if parent_ref.section_name else "",
                f"port {parent_ref.port}" if parent_ref.port is not None else "",
            )
            if part
        )
        return _refused("NoMatchingParent", f"{where} has no {wanted}")
    reasons: list[tuple[str, str]] = []
    attached_to = []
    for listener in candidates:
        problem = listener.admits(key.kind, key.namespace)
        if problem is not None:
            reasons.append(("NotAllowedByListeners", f"listener {listener.name}: {problem}"))
            continue
        domains = listener.intersect(route.spec.hostnames)
        if not domains:
            reasons.append(
                (
                    "NoMatchingListenerHostname",
                    f"listener {listener.name} ({listener.hostname or 'any name'}): none of "
                    f"the hostnames {list(route.spec.hostnames)} intersects it",
                )
            )
            continue
        refused = take(listener, domains)
        if refused is not None:
            reasons.append(("NotAllowedByListeners", f"listener {listener.name}: {refused}"))
            continue
        served.routes.setdefault(listener.name, set()).add(str(key))
        attached_to.append(listener.name)
    if not attached_to:
        order = ("NotAllowedByListeners", "NoMatchingListenerHostname")
        reason = min((r for r, _ in reasons), key=order.index)
        return _refused(reason, f"{where}: " + "; ".join(m for _, m in reasons))
    message = f"attached to {where} listener(s) {', '.join(attached_to)}"
    if reasons:
        message += " (not to: " + "; ".join(m for _, m in reasons) + ")"
    return Condition("Accepted", "True", "Accepted", message)


def _attach(
    served: ServedGateway,
    document: Document,
    parent_ref: gateway.ParentReference,
    grpc: bool,
    rules: list[Rule],
    created: datetime,
) -> Condition:
    """An HTTPRoute's or GRPCRoute's rules on the listeners it attaches to."""

    def take(listener: GatewayListener, domains: tuple[str, ...]) -> str | None:
        conflict = _conflict(served, listener.name, grpc, domains)
        if conflict is not None:
            return (
                f"{conflict} has intersecting hostnames and is older: a GRPCRoute and an "
                "HTTPRoute cannot share a hostname (GEP-1016)"
            )
        served.rules.setdefault(listener.name, []).extend(
            _rules(document, grpc, rules, domains, created)
        )
        return None

    return attach(served, document, parent_ref, take)


def _conflict(
    served: ServedGateway, listener: str, grpc: bool, domains: tuple[str, ...]
) -> str | None:
    for rule in served.rules.get(listener, ()):
        if rule.grpc != grpc and set(rule.domains) & set(domains):
            return rule.route
    return None


def _rules(
    document: Document,
    grpc: bool,
    rules: list[Rule],
    domains: tuple[str, ...],
    created: datetime,
) -> list[GatewayRule]:
    key = document.key
    found = []
    for rule in rules:
        for m_index, (match, specific, prefix) in enumerate(rule.matches):
            precedence = (specific, created, key.namespace, key.name, rule.index, m_index)
            found.append(
                GatewayRule(
                    source=f"{key} rule {rule.index}",
                    route=str(key),
                    grpc=grpc,
                    domains=domains,
                    precedence=precedence,
                    match_index=m_index,
                    attached=attached_rule(
                        rule, document, grpc, None, None, (), precedence, match, prefix
                    ),
                )
            )
    return found


def _base(document: Document) -> Status:
    key = document.key
    return Status(
        key=str(key),
        kind=key.kind,
        namespace=key.namespace,
        name=key.name,
        state="valid",
        source=document.origin.source,
        document=document.origin.index + 1,
        api_version=document.api_version,
    )


def _ignored(document: Document, reason: str) -> Status:
    return replace(_base(document), state="ignored", reason=reason)


def _class_status(document: Document) -> Status:
    spec = document.resource.spec
    version = Condition(
        "SupportedVersion", "True", "SupportedVersion", "Gateway API v1.6.1 (standard channel)"
    )
    if spec.parameters_ref is not None:
        ref = spec.parameters_ref
        accepted = Condition(
            "Accepted",
            "False",
            "InvalidParameters",
            f"parametersRef {ref.kind} {ref.name}: Trellis' GatewayClass takes no parameters",
        )
        return replace(
            _base(document), state="error", reason=accepted.message, conditions=(accepted, version)
        )
    accepted = Condition("Accepted", "True", "Accepted", "served by Trellis' gateway Envoys")
    return replace(_base(document), conditions=(accepted, version))


def _gateway_status(document: Document, served: ServedGateway) -> Status:
    spec = document.resource.spec
    listeners = tuple(
        listener.status(len(served.routes.get(listener.name, ()))) for listener in served.listeners
    )
    valid = [listener for listener in served.listeners if listener.served]
    base = _base(document)
    if spec.addresses:
        accepted = Condition(
            "Accepted",
            "False",
            "UnsupportedAddress",
            "spec.addresses: Trellis does not assign addresses; the gateway's Service "
            "(Kubernetes) or host (locally) has them",
        )
        programmed = Condition("Programmed", "False", "Invalid", "not accepted")
        return replace(
            base,
            state="error",
            reason=accepted.message,
            conditions=(accepted, programmed),
            listeners=listeners,
        )
    parameters = (spec.infrastructure or {}).get("parametersRef")
    if parameters:
        accepted = Condition(
            "Accepted",
            "False",
            "InvalidParameters",
            f"spec.infrastructure.parametersRef {parameters}: Trellis' gateway takes no parameters",
        )
        programmed = Condition("Programmed", "False", "Invalid", "not accepted")
        return replace(
            base,
            state="error",
            reason=accepted.message,
            conditions=(accepted, programmed),
            listeners=listeners,
        )
    invalid = [listener.name for listener in served.listeners if not listener.served]
    if not valid:
        accepted = Condition(
            "Accepted", "False", "ListenersNotValid", "no listener can be served: see listeners"
        )
        programmed = Condition("Programmed", "False", "Invalid", "no listener can be served")
        state, reason = "error", accepted.message
    else:
        reason_text = "; ".join(
            part
            for part in (
                f"listeners not served: {', '.join(invalid)} (see their conditions)"
                if invalid
                else "",
                f"read, not applied: {', '.join(spec.not_applied())}" if spec.not_applied() else "",
            )
            if part
        )
        accepted = Condition(
            "Accepted",
            "True",
            "ListenersNotValid" if invalid else "Accepted",
            reason_text or "served by a Trellis gateway Envoy",
        )
        programmed = Condition(
            "Programmed",
            "True",
            "Programmed",
            f"{len(valid)} listener(s) in the view of identity {served.namespace}/{served.name}",
        )
        state, reason = ("warning", reason_text) if reason_text else ("valid", "")
    return replace(
        base, state=state, reason=reason, conditions=(accepted, programmed), listeners=listeners
    )


def _refused(reason: str, message: str) -> Condition:
    return Condition("Accepted", "False", reason, message)
