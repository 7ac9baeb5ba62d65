"""TrafficTargets resolved into grants, indexed for the questions the catalog asks.

A TrafficTarget resolves against the route documents its rules name (HTTPRouteGroups,
TCPRoutes, GRPCRoutes) into a :class:`Grant`: who may call which account on what. The
:class:`Grants` index keeps every grant by its destination account (in the targets' key
order), the accounts each source may call (counted: two grants may allow the same pair),
and which targets name each route. So an edit of one target, or of one route, re-resolves
only the targets it touches (:func:`~trellis_spec.mesh.patch`), and nobody walks
every grant to learn what one source may call.

:meth:`Grants.copy` is a copy on write: the copy shares the previous index's containers
until it changes one, so the previous spec (and the builders that read it) never see an
edit, and a copy costs what the edit touches.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from trellis_common.documents import gateway, smi
from trellis_common.documents.base import Document, DocumentKey
from trellis_common.model import ServiceAccount
from trellis_spec.gateway_matches import grpc_match
from trellis_spec.matches import HttpMatch

RouteKey = tuple[str, str, str]  # (namespace, kind, name) of a route a rule names
Named = tuple[str, str]  # (namespace, name)
K = TypeVar("K")
C = TypeVar("C", "list[Grant]", "set[DocumentKey]", "dict[ServiceAccount, int]")


@dataclass(frozen=True, slots=True)
class AllowedRule:
    """A TrafficTarget rule resolved to what it allows (references checked)."""

    http: tuple[smi.HTTPMatch, ...] = ()
    tcp_ports: tuple[int, ...] = ()
    tcp_all: bool = False
    grpc: tuple[HttpMatch, ...] = ()  # a GRPCRoute's matches (methods, headers)


@dataclass(frozen=True, slots=True)
class Grant:
    """One TrafficTarget, resolved: who may call which account on what."""

    policy: str  # "<namespace>/<name>"
    destination: ServiceAccount
    sources: tuple[ServiceAccount, ...]
    port: int | None
    rules: tuple[AllowedRule, ...]


@dataclass(frozen=True, slots=True)
class Routes:
    """The route documents a TrafficTarget's rules may name, by (namespace, name)."""

    http: Mapping[Named, smi.HTTPRouteGroup]
    tcp: Mapping[Named, smi.TCPRoute]
    grpc: Mapping[Named, gateway.GRPCRoute]


def _order(grant: Grant) -> tuple[str, str]:
    """A grant's place among its destination's: its TrafficTarget's (namespace, name)."""
    namespace, _, name = grant.policy.partition("/")
    return namespace, name


def named_routes(target: smi.TrafficTarget) -> frozenset[RouteKey]:
    namespace = target.metadata.namespace
    return frozenset((namespace, rule.kind, rule.name) for rule in target.spec.rules)


class Grants:
    def __init__(self) -> None:
        self._by_destination: dict[ServiceAccount, list[Grant]] = {}
        self._by_target: dict[DocumentKey, Grant] = {}  # every resolved target, ruleless too
        self._callers: dict[ServiceAccount, dict[ServiceAccount, int]] = {}  # source -> dest
        self._naming: dict[RouteKey, set[DocumentKey]] = {}  # route -> targets naming it
        self._routes_of: dict[DocumentKey, frozenset[RouteKey]] = {}
        # copy on write: the keys of the containers this index may change in place; None:
        # all of them (a new index shares nothing)
        self._owned: set[object] | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Grants):
            return NotImplemented
        return (
            self._by_destination == other._by_destination
            and self._by_target == other._by_target
            and self._callers == other._callers
            and self._naming == other._naming
        )

    __hash__ = None  # type: ignore[assignment]

    def copy(self) -> Grants:
        copied = Grants()
        copied._by_destination = dict(self._by_destination)
        copied._by_target = dict(self._by_target)
        copied._callers = dict(self._callers)
        copied._naming = dict(self._naming)
        copied._routes_of = dict(self._routes_of)
        copied._owned = set()
        return copied

    # -- questions ---------------------------------------------------------------------

    def to(self, account: ServiceAccount) -> list[Grant]:
        """The grants (with rules) to ``account``, in their targets' key order."""
        return self._by_destination.get(account, [])

    def allowed(self, source: ServiceAccount) -> Collection[ServiceAccount]:
        """The accounts some grant lets ``source`` call."""
        return self._callers.get(source, {}).keys()

    def callers(self) -> Iterable[ServiceAccount]:
        return self._callers.keys()

    def naming(self, routes: Iterable[RouteKey]) -> set[DocumentKey]:
        """The TrafficTargets whose rules name any of ``routes``."""
        found: set[DocumentKey] = set()
        for route in routes:
            found |= self._naming.get(route, set())
        return found

    def of(self, target: DocumentKey) -> Grant | None:
        return self._by_target.get(target)

    # -- changes -----------------------------------------------------------------------

    def add(self, document: Document, routes: Routes) -> list[str]:
        """Resolve the TrafficTarget ``document`` and index it (after the grants of the
        targets before it in key order, when added in that order); its problems."""
        grant, problems = resolve(document, routes)
        key = document.key
        self._by_target[key] = grant
        named = named_routes(document.resource)
        self._routes_of[key] = named
        for route in named:
            self._own(self._naming, "naming", route, set).add(key)
        if grant.rules:
            grants = self._own(self._by_destination, "grants", grant.destination, list)
            if grants and _order(grants[-1]) > _order(grant):
                bisect.insort(grants, grant, key=_order)
            else:
                grants.append(grant)
            for source in grant.sources:
                counts = self._own(self._callers, "callers", source, dict)
                counts[grant.destination] = counts.get(grant.destination, 0) + 1
        return problems

    def remove(self, key: DocumentKey) -> None:
        grant = self._by_target.pop(key, None)
        if grant is None:
            return
        for route in self._routes_of.pop(key):
            naming = self._own(self._naming, "naming", route, set)
            naming.discard(key)
            if not naming:
                del self._naming[route]
        if not grant.rules:
            return
        grants = self._own(self._by_destination, "grants", grant.destination, list)
        grants.remove(grant)
        if not grants:
            del self._by_destination[grant.destination]
        for source in grant.sources:
            counts = self._own(self._callers, "callers", source, dict)
            counts[grant.destination] -= 1
            if not counts[grant.destination]:
                del counts[grant.destination]
            if not counts:
                del self._callers[source]

    def _own(self, table: dict[K, C], kind: str, key: K, new: Callable[[], C]) -> C:
        """``table[key]``, this index's own: created, or copied from the index this one
        was copied from before its first change."""
        found = table.get(key)
        tag = (kind, key)
        if found is None:
            found = table[key] = new()
        elif self._owned is not None and tag not in self._owned:
            found = table[key] = found.copy()
        else:
            return found
        if self._owned is not None:
            self._owned.add(tag)
        return found


def _grpc_rule(
    route: gateway.GRPCRoute, names: tuple[str, ...], where: str, problems: list[str]
) -> AllowedRule | None:
    """What a TrafficTarget rule naming a GRPCRoute allows: its rules' matches (those
    ``names`` names, else all); a rule without matches allows every method."""
    rules = route.spec.rules
    if names:
        known = {r.name for r in rules if r.name}
        unknown = [n for n in names if n not in known]
        if unknown:
            problems.append(
                f"{where}: GRPCRoute {route.metadata.namespace}/{route.metadata.name} has no "
                "rule named " + ", ".join(repr(u) for u in unknown)
            )
        rules = tuple(r for r in rules if r.name in names)
    if not rules:
        return None
    matches = tuple(grpc_match(m) for r in rules for m in (r.matches or (None,)))
    return AllowedRule(grpc=tuple(dict.fromkeys(matches)))


def resolve(document: Document, routes: Routes) -> tuple[Grant, list[str]]:
    """The TrafficTarget ``document`` resolved against ``routes``; its problems."""
    target: smi.TrafficTarget = document.resource
    namespace = document.key.namespace
    rules: list[AllowedRule] = []
    problems: list[str] = []
    for index, rule in enumerate(target.spec.rules):
        where = f"spec.rules[{index}]"
        if rule.kind == "HTTPRouteGroup":
            group = routes.http.get((namespace, rule.name))
            if group is None:
                problems.append(f"{where}: HTTPRouteGroup {namespace}/{rule.name} not found")
                continue
            if rule.matches:
                found = [group.match_by_name(name) for name in rule.matches]
                unknown = [n for n, m in zip(rule.matches, found, strict=True) if m is None]
                if unknown:
                    problems.append(
                        f"{where}: HTTPRouteGroup {namespace}/{rule.name} has no match named "
                        + ", ".join(repr(u) for u in unknown)
                    )
                matches = tuple(m for m in found if m is not None)
                if not matches:
                    continue
            else:
                matches = group.spec.matches
            rules.append(AllowedRule(http=matches))
        elif rule.kind == "GRPCRoute":
            grpc_route = routes.grpc.get((namespace, rule.name))
            if grpc_route is None:
                problems.append(f"{where}: GRPCRoute {namespace}/{rule.name} not found")
                continue
            allowed = _grpc_rule(grpc_route, rule.matches, where, problems)
            if allowed is not None:
                rules.append(allowed)
        else:
            route = routes.tcp.get((namespace, rule.name))
            if route is None:
                problems.append(f"{where}: TCPRoute {namespace}/{rule.name} not found")
                continue
            ports = route.spec.matches.ports
            rules.append(AllowedRule(tcp_ports=tuple(ports), tcp_all=not ports))
    grant = Grant(
        policy=f"{namespace}/{document.key.name}",
        destination=target.destination_account(),
        sources=target.source_accounts(),
        port=target.spec.destination.port,
        rules=tuple(rules),
    )
    if not rules:
        problems.append("no rule can be applied: this TrafficTarget allows nothing")
    return grant, problems
