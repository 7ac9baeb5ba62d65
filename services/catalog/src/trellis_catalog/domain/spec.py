"""The mesh specification: validated documents, indexed for the catalog, with statuses.

Documents arrive already parsed (the spec directory or, later, the Kubernetes API). Here
they are indexed by what the catalog asks (services, splits by root, targets by
destination account, route groups by name) and checked against each other: a TrafficTarget
rule naming a missing HTTPRouteGroup or match, a second TrafficSplit for the same root, a
second MeshConfig. Each document gets a status (``valid``, ``warning`` or ``error`` with a
reason); an error never breaks the rest, and the broken part is left out: deny by default.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from trellis_catalog.domain.gateway_matches import grpc_match
from trellis_catalog.domain.steps import Steps, drain
from trellis_catalog.domain.views import HttpMatch
from trellis_common.documents import core, gateway, istio, meshconfig, osm, osm_access, smi
from trellis_common.documents.base import Document, DocumentError, DocumentKey, UnreadKind
from trellis_common.model import MeshService, ServiceAccount

STEP = 200  # documents between two steps of a build

KINDS = (
    "Service",
    "ServiceAccount",
    "TrafficSplit",
    "TrafficTarget",
    "HTTPRouteGroup",
    "TCPRoute",
    "ServiceEntry",
    "MeshConfig",
    "Retry",
    "UpstreamTrafficSetting",
    "GRPCRoute",
    "HTTPRoute",
    "Egress",
    "IngressBackend",
)


@dataclass(frozen=True, slots=True)
class Condition:
    """A Gateway API condition (``Accepted``, ``ResolvedRefs``) as upstream spells it."""

    type: str
    status: str  # "True" or "False"
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class ParentStatus:
    """A route's status for one of its parents (a Service, in the mesh)."""

    group: str
    kind: str
    namespace: str
    name: str
    port: int | None
    conditions: tuple[Condition, ...]


@dataclass(frozen=True, slots=True)
class Status:
    key: str
    kind: str
    namespace: str
    name: str
    state: str  # valid, warning, error, ignored (a kind no service reads)
    reason: str = ""
    field: str = ""
    source: str = ""
    document: int = 0
    api_version: str = ""
    parents: tuple[ParentStatus, ...] = ()  # Gateway API routes: per parent


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


@dataclass
class MeshSpec:
    services: dict[MeshService, core.Service] = field(default_factory=dict)
    service_accounts: set[ServiceAccount] = field(default_factory=set)
    splits: dict[MeshService, smi.TrafficSplit] = field(default_factory=dict)
    split_names: dict[MeshService, str] = field(default_factory=dict)
    grants: dict[ServiceAccount, list[Grant]] = field(default_factory=lambda: defaultdict(list))
    route_groups: dict[tuple[str, str], smi.HTTPRouteGroup] = field(default_factory=dict)
    service_entries: list[tuple[DocumentKey, istio.ServiceEntrySpec]] = field(default_factory=list)
    settings: meshconfig.MeshConfigSettings | None = None
    statuses: dict[str, Status] = field(default_factory=dict)
    retries: list[tuple[str, osm.Retry]] = field(default_factory=list)  # by "<ns>/<name>"
    # the service each UpstreamTrafficSetting names -> ("<ns>/<name>", its spec)
    upstream_settings: dict[MeshService, tuple[str, osm.UpstreamTrafficSettingSpec]] = field(
        default_factory=dict
    )
    gateway_routes: list[Document] = field(default_factory=list)  # GRPCRoute, HTTPRoute
    # every UpstreamTrafficSetting by (namespace, name): an Egress names one that way
    traffic_settings: dict[tuple[str, str], osm.UpstreamTrafficSettingSpec] = field(
        default_factory=dict
    )
    egresses: list[tuple[str, osm_access.Egress]] = field(default_factory=list)
    ingress_backends: list[tuple[str, osm_access.IngressBackend]] = field(default_factory=list)

    def grpc_backends(self) -> dict[MeshService, frozenset[int]]:
        """The Service ports GRPCRoutes send to: gRPC (h2c) unless they say otherwise."""
        found: dict[MeshService, set[int]] = defaultdict(set)
        for document in self.gateway_routes:
            resource = document.resource
            if not isinstance(resource, gateway.GRPCRoute):
                continue
            for rule in resource.spec.rules:
                for ref in rule.backend_refs:
                    if ref.is_service and ref.port is not None:
                        namespace = ref.namespace or document.key.namespace
                        found[MeshService(namespace, ref.name)].add(ref.port)
        return {service: frozenset(ports) for service, ports in found.items()}

    @property
    def permissive(self) -> bool:
        return self.settings.permissive if self.settings else False

    @property
    def egress(self) -> bool:
        return self.settings.egress if self.settings else False

    @property
    def retry_enabled(self) -> bool:
        return self.settings.retry_policy if self.settings else False

    def retry_for(
        self, source: ServiceAccount, destination: MeshService
    ) -> tuple[str, osm.RetryPolicySpec] | None:
        """The Retry policy (its name and spec) for calls from ``source`` to
        ``destination``: the first by namespace/name, and none while MeshConfig's
        ``featureFlags.enableRetryPolicy`` is off (OSM's ``getRetryPolicy``)."""
        if not self.retry_enabled:
            return None
        for name, retry in self.retries:
            if retry.source_account() == source and destination in retry.destination_services():
                return name, retry.spec.retry_policy
        return None

    def retried(self, destination: MeshService) -> bool:
        """Some source's calls to ``destination`` are retried (a profile's view of it)."""
        return self.retry_enabled and any(
            destination in retry.destination_services() for _, retry in self.retries
        )

    def grants_to(self, account: ServiceAccount) -> list[Grant]:
        return self.grants.get(account, [])

    def allowed_accounts(self) -> dict[ServiceAccount, set[ServiceAccount]]:
        """source account -> destination accounts it may call (by any grant)."""
        allowed: dict[ServiceAccount, set[ServiceAccount]] = defaultdict(set)
        for grants in self.grants.values():
            for grant in grants:
                if grant.rules:
                    for source in grant.sources:
                        allowed[source].add(grant.destination)
        return allowed


def _status(document: Document, state: str = "valid", reason: str = "") -> Status:
    key = document.key
    return Status(
        key=str(key),
        kind=key.kind,
        namespace=key.namespace,
        name=key.name,
        state=state,
        reason=reason,
        source=document.origin.source,
        document=document.origin.index + 1,
        api_version=document.api_version,
    )


def error_status(error: DocumentError) -> Status:
    """An error's status: ``error``, or ``ignored`` for a kind no service reads."""
    key = error.key
    return Status(
        key=str(key) if key else f"{error.origin.source}#{error.origin.index + 1}",
        kind=key.kind if key else "",
        namespace=key.namespace if key else "",
        name=key.name if key else "",
        state="ignored" if isinstance(error, UnreadKind) else "error",
        reason=error.reason,
        field=error.field,
        source=error.origin.source,
        document=error.origin.index + 1,
    )


def build(documents: Iterable[Document], errors: Iterable[DocumentError] = ()) -> MeshSpec:
    return drain(build_steps(documents, errors))


def build_steps(
    documents: Iterable[Document], errors: Iterable[DocumentError] = ()
) -> Steps[MeshSpec]:
    """:func:`build` in steps (a new spec: nothing shared is touched until it returns)."""
    spec = MeshSpec()
    # the keys' order, compared as plain tuples (in C, not by the dataclass' __lt__)
    ordered = sorted(documents, key=lambda d: (d.key.kind, d.key.namespace, d.key.name))
    targets: list[Document] = []
    tcp_routes: dict[tuple[str, str], smi.TCPRoute] = {}
    for position, document in enumerate(ordered):
        if position % STEP == 0:
            yield
        resource = document.resource
        key = document.key
        status = _status(document)
        if isinstance(resource, core.Service):
            spec.services[MeshService(key.namespace, key.name)] = resource
        elif isinstance(resource, core.ServiceAccount):
            spec.service_accounts.add(ServiceAccount(key.namespace, key.name))
        elif isinstance(resource, smi.TrafficSplit):
            root = resource.root_service()
            if root in spec.splits:
                status = _status(
                    document,
                    "error",
                    f"conflicts with TrafficSplit {spec.split_names[root]}, which already "
                    f"splits {root}; this one is ignored",
                )
            else:
                spec.splits[root] = resource
                spec.split_names[root] = f"{key.namespace}/{key.name}"
        elif isinstance(resource, smi.TrafficTarget):
            targets.append(document)
        elif isinstance(resource, smi.HTTPRouteGroup):
            spec.route_groups[(key.namespace, key.name)] = resource
        elif isinstance(resource, smi.TCPRoute):
            tcp_routes[(key.namespace, key.name)] = resource
        elif isinstance(resource, istio.ServiceEntry):
            spec.service_entries.append((key, resource.spec))
        elif isinstance(resource, gateway.GRPCRoute | gateway.HTTPRoute):
            spec.gateway_routes.append(document)  # resolved against the services later
        elif isinstance(resource, osm.Retry):
            spec.retries.append((f"{key.namespace}/{key.name}", resource))
            if resource.skipped():
                status = _status(document, "warning", "; ".join(resource.skipped()))
        elif isinstance(resource, osm.UpstreamTrafficSetting):
            spec.traffic_settings[(key.namespace, key.name)] = resource.spec
            status = _upstream_setting(spec, document, resource)
        elif isinstance(resource, osm_access.Egress):
            spec.egresses.append((f"{key.namespace}/{key.name}", resource))
        elif isinstance(resource, osm_access.IngressBackend):
            spec.ingress_backends.append((f"{key.namespace}/{key.name}", resource))
        elif isinstance(resource, meshconfig.MeshConfig | meshconfig.OsmMeshConfig):
            if spec.settings is not None:
                status = _status(
                    document, "error", "a second MeshConfig: only one is read; this one is ignored"
                )
            else:
                spec.settings = resource.settings()
                unapplied = (
                    resource.not_applied() if isinstance(resource, meshconfig.OsmMeshConfig) else ()
                )
                if unapplied:  # accepted, never rejected: listed so nobody expects them
                    status = _status(
                        document, reason="accepted; not applied by Trellis: " + ", ".join(unapplied)
                    )
        spec.statuses[str(key)] = status
    grpc_routes = {
        (d.key.namespace, d.key.name): d.resource
        for d in spec.gateway_routes
        if isinstance(d.resource, gateway.GRPCRoute)
    }
    for position, document in enumerate(targets):
        if position % STEP == 0:
            yield
        grant, problems = _grant(document, spec.route_groups, tcp_routes, grpc_routes)
        if grant.rules:
            spec.grants[grant.destination].append(grant)
        if problems:
            state = "warning" if grant.rules else "error"
            spec.statuses[str(document.key)] = _status(document, state, "; ".join(problems))
    if not spec.retry_enabled:
        for name, _ in spec.retries:
            retry_key = f"Retry {name}"
            if spec.statuses[retry_key].state == "valid":
                spec.statuses[retry_key] = replace(
                    spec.statuses[retry_key],
                    state="warning",
                    reason="has no effect: MeshConfig spec.featureFlags.enableRetryPolicy is off",
                )
    for root, split in spec.splits.items():
        missing = [
            b.service
            for b in split.spec.backends
            if MeshService(root.namespace, b.service) not in spec.services
        ]
        if missing:
            status_key = f"TrafficSplit {spec.split_names[root]}"
            spec.statuses[status_key] = replace(
                spec.statuses[status_key],
                state="warning",
                reason="backend services not declared (yet): "
                + ", ".join(missing)
                + "; they get traffic once a provider reports endpoints",
            )
    for error in errors:
        status = error_status(error)
        if status.key in spec.statuses:
            # the last good version stays in force; its rejected edit is reported beside it
            status = replace(status, key=f"{status.key} (rejected edit)")
        spec.statuses.setdefault(status.key, status)
    return spec


def _upstream_setting(
    spec: MeshSpec, document: Document, setting: osm.UpstreamTrafficSetting
) -> Status:
    """Index one UpstreamTrafficSetting by the service its host names; its status."""
    name = f"{document.key.namespace}/{document.key.name}"
    service = setting.service()
    if service is None:
        return _status(
            document,
            "error",
            f"spec.host {setting.spec.host!r} names no service of namespace "
            f"{document.key.namespace!r}: OSM matches '<service>.{document.key.namespace}"
            ".svc.cluster.local' only",
        )
    taken = spec.upstream_settings.get(service)
    if taken is not None:
        return _status(
            document,
            "error",
            f"conflicts with UpstreamTrafficSetting {taken[0]}, which already sets {service}; "
            "this one is ignored",
        )
    spec.upstream_settings[service] = (name, setting.spec)
    if setting.not_applied():
        return _status(
            document,
            "warning",
            f"{' and '.join(setting.not_applied())} read but not applied (a global limit needs "
            "an external rate limit service); the rest applies",
        )
    return _status(document)


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


def _grant(
    document: Document,
    route_groups: dict[tuple[str, str], smi.HTTPRouteGroup],
    tcp_routes: dict[tuple[str, str], smi.TCPRoute],
    grpc_routes: dict[tuple[str, str], gateway.GRPCRoute],
) -> tuple[Grant, list[str]]:
    target: smi.TrafficTarget = document.resource
    namespace = document.key.namespace
    rules: list[AllowedRule] = []
    problems: list[str] = []
    for index, rule in enumerate(target.spec.rules):
        where = f"spec.rules[{index}]"
        if rule.kind == "HTTPRouteGroup":
            group = route_groups.get((namespace, rule.name))
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
            grpc_route = grpc_routes.get((namespace, rule.name))
            if grpc_route is None:
                problems.append(f"{where}: GRPCRoute {namespace}/{rule.name} not found")
                continue
            allowed = _grpc_rule(grpc_route, rule.matches, where, problems)
            if allowed is not None:
                rules.append(allowed)
        else:
            route = tcp_routes.get((namespace, rule.name))
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
