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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from trellis_common.documents import (
    core,
    gateway,
    gateway_api,
    istio,
    meshconfig,
    osm,
    osm_access,
    smi,
)
from trellis_common.documents.base import (
    Document,
    DocumentError,
    DocumentKey,
)
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec.grants import Grant, Grants, Routes
from trellis_spec.statuses import Status, document_status, error_status
from trellis_spec.steps import Steps, drain

STEP = 200  # documents between two steps of a build
TARGET_STEP = 50  # TrafficTargets resolved between two steps

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
    "Namespace",
    "GatewayClass",
    "Gateway",
    "ReferenceGrant",
    "TLSRoute",
)


@dataclass
class MeshSpec:
    services: dict[MeshService, core.Service] = field(default_factory=dict)
    service_accounts: set[ServiceAccount] = field(default_factory=set)
    splits: dict[MeshService, smi.TrafficSplit] = field(default_factory=dict)
    split_names: dict[MeshService, str] = field(default_factory=dict)
    grants: Grants = field(default_factory=Grants)
    targets: dict[DocumentKey, Document] = field(default_factory=dict)  # TrafficTargets
    route_groups: dict[tuple[str, str], smi.HTTPRouteGroup] = field(default_factory=dict)
    tcp_routes: dict[tuple[str, str], smi.TCPRoute] = field(default_factory=dict)
    service_entries: list[tuple[DocumentKey, istio.ServiceEntrySpec]] = field(default_factory=list)
    settings: meshconfig.MeshConfigSettings | None = None
    statuses: dict[str, Status] = field(default_factory=dict)
    retries: list[tuple[str, osm.Retry]] = field(default_factory=list)  # by "<ns>/<name>"
    # the service each UpstreamTrafficSetting names -> ("<ns>/<name>", its spec)
    upstream_settings: dict[MeshService, tuple[str, osm.UpstreamTrafficSettingSpec]] = field(
        default_factory=dict
    )
    gateway_routes: list[Document] = field(default_factory=list)  # GRPCRoute, HTTPRoute
    tls_routes: list[Document] = field(default_factory=list)  # TLSRoute (Gateways only)
    # every UpstreamTrafficSetting by (namespace, name): an Egress names one that way
    traffic_settings: dict[tuple[str, str], osm.UpstreamTrafficSettingSpec] = field(
        default_factory=dict
    )
    egresses: list[tuple[str, osm_access.Egress]] = field(default_factory=list)
    ingress_backends: list[tuple[str, osm_access.IngressBackend]] = field(default_factory=list)
    # north-south: GatewayClasses, Gateways, ReferenceGrants (resolved later, with the routes)
    gateway_classes: list[Document] = field(default_factory=list)
    gateways: list[Document] = field(default_factory=list)
    reference_grants: list[Document] = field(default_factory=list)
    namespace_labels: dict[str, dict[str, str]] = field(default_factory=dict)

    def route_ports(self) -> dict[MeshService, frozenset[tuple[int, str]]]:
        """The Service ports routes send to, with the protocol they speak there unless the
        port declares one (``appProtocol`` or its name): a GRPCRoute's backends and mirrors
        gRPC (h2c), a TLSRoute's backends TCP (the client's TLS passes through)."""
        found: dict[MeshService, set[tuple[int, str]]] = defaultdict(set)
        for document in self.gateway_routes + self.tls_routes:
            resource = document.resource
            if isinstance(resource, gateway.HTTPRoute):
                continue
            protocol = "grpc" if isinstance(resource, gateway.GRPCRoute) else "tcp"
            for rule in resource.spec.rules:
                mirrors = [
                    f.request_mirror.backend_ref
                    for f in getattr(rule, "filters", ())
                    if f.type == "RequestMirror" and f.request_mirror is not None
                ]  # a mirror gets the same gRPC calls
                for ref in [*rule.backend_refs, *mirrors]:
                    if ref.is_service and ref.port is not None:
                        namespace = ref.namespace or document.key.namespace
                        found[MeshService(namespace, ref.name)].add((ref.port, protocol))
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
        return self.grants.to(account)

    def allowed_accounts(self) -> dict[ServiceAccount, set[ServiceAccount]]:
        """source account -> destination accounts it may call (by any grant)."""
        return {source: set(self.grants.allowed(source)) for source in self.grants.callers()}

    def split_route_groups(self) -> set[tuple[str, str]]:
        """The HTTPRouteGroups (namespace, name) a TrafficSplit's ``matches`` names."""
        return {
            (root.namespace, match.name)
            for root, split in self.splits.items()
            for match in split.spec.matches
        }

    def egress_route_groups(self) -> set[tuple[str, str]]:
        """The HTTPRouteGroups (namespace, name) an Egress's ``matches`` names."""
        return {
            (name.partition("/")[0], group)
            for name, egress in self.egresses
            for group in egress.route_groups()
        }


def build(documents: Iterable[Document], errors: Iterable[DocumentError] = ()) -> MeshSpec:
    return drain(build_steps(documents, errors))


def build_steps(
    documents: Iterable[Document], errors: Iterable[DocumentError] = ()
) -> Steps[MeshSpec]:
    """:func:`build` in steps (a new spec: nothing shared is touched until it returns)."""
    spec = MeshSpec()
    targets: list[Document] = []
    ordered = yield from _in_key_order(documents)
    for position, document in enumerate(ordered):
        if position % STEP == 0:
            yield
        resource = document.resource
        key = document.key
        status = document_status(document)
        if isinstance(resource, core.Service):
            spec.services[MeshService(key.namespace, key.name)] = resource
        elif isinstance(resource, core.ServiceAccount):
            spec.service_accounts.add(ServiceAccount(key.namespace, key.name))
        elif isinstance(resource, smi.TrafficSplit):
            root = resource.root_service()
            if root in spec.splits:
                status = document_status(
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
            spec.tcp_routes[(key.namespace, key.name)] = resource
        elif isinstance(resource, istio.ServiceEntry):
            spec.service_entries.append((key, resource.spec))
            limits = resource.spec.limits()
            if limits:  # served, except these parts
                reason = "; ".join(f"{where}: {why}" for where, why in limits)
                status = replace(document_status(document, "warning", reason), field=limits[0][0])
        elif isinstance(resource, gateway.GRPCRoute | gateway.HTTPRoute):
            spec.gateway_routes.append(document)  # resolved against the services later
        elif isinstance(resource, gateway_api.TLSRoute):
            spec.tls_routes.append(document)  # attached to Gateways later
        elif isinstance(resource, gateway_api.GatewayClass):
            spec.gateway_classes.append(document)
        elif isinstance(resource, gateway_api.Gateway):
            spec.gateways.append(document)
        elif isinstance(resource, gateway_api.ReferenceGrant):
            spec.reference_grants.append(document)
        elif isinstance(resource, core.Namespace):
            spec.namespace_labels[key.name] = resource.selector_labels()
        elif isinstance(resource, osm.Retry):
            spec.retries.append((f"{key.namespace}/{key.name}", resource))
            if resource.skipped():
                status = document_status(document, "warning", "; ".join(resource.skipped()))
        elif isinstance(resource, osm.UpstreamTrafficSetting):
            spec.traffic_settings[(key.namespace, key.name)] = resource.spec
            status = _upstream_setting(spec, document, resource)
        elif isinstance(resource, osm_access.Egress):
            spec.egresses.append((f"{key.namespace}/{key.name}", resource))
        elif isinstance(resource, osm_access.IngressBackend):
            spec.ingress_backends.append((f"{key.namespace}/{key.name}", resource))
        elif isinstance(resource, meshconfig.MeshConfig | meshconfig.OsmMeshConfig):
            if spec.settings is not None:
                status = document_status(
                    document, "error", "a second MeshConfig: only one is read; this one is ignored"
                )
            else:
                spec.settings = resource.settings()
                unapplied = (
                    resource.not_applied() if isinstance(resource, meshconfig.OsmMeshConfig) else ()
                )
                if unapplied:  # accepted, never rejected: listed so nobody expects them
                    status = document_status(
                        document, reason="accepted; not applied by Trellis: " + ", ".join(unapplied)
                    )
        spec.statuses[str(key)] = status
    routes = _routes(spec)
    for position, document in enumerate(targets):
        if position % TARGET_STEP == 0:
            yield
        spec.targets[document.key] = document
        spec.statuses[str(document.key)] = _target_status(spec, document, routes)
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


def _in_key_order(documents: Iterable[Document]) -> Steps[list[Document]]:
    """``documents`` by kind, namespace and name, in steps: grouped by kind a few thousand
    at a time, then sorted one kind at a time (grouping and sorting tens of thousands of
    documents at once held an event loop for 25 ms at 5,000 services), compared as plain
    tuples (in C, not by the dataclass' ``__lt__``)."""
    by_kind: dict[str, list[Document]] = defaultdict(list)
    for position, document in enumerate(documents):
        if position % (STEP * 25) == 0:
            yield
        by_kind[document.key.kind].append(document)
    ordered: list[Document] = []
    for kind in sorted(by_kind):
        yield
        ordered += sorted(by_kind[kind], key=lambda d: (d.key.namespace, d.key.name))
    return ordered


def _upstream_setting(
    spec: MeshSpec, document: Document, setting: osm.UpstreamTrafficSetting
) -> Status:
    """Index one UpstreamTrafficSetting by the service its host names; its status."""
    name = f"{document.key.namespace}/{document.key.name}"
    service = setting.service()
    if service is None:
        return document_status(
            document,
            "error",
            f"spec.host {setting.spec.host!r} names no service of namespace "
            f"{document.key.namespace!r}: OSM matches '<service>.{document.key.namespace}"
            ".svc.cluster.local' only",
        )
    taken = spec.upstream_settings.get(service)
    if taken is not None:
        return document_status(
            document,
            "error",
            f"conflicts with UpstreamTrafficSetting {taken[0]}, which already sets {service}; "
            "this one is ignored",
        )
    spec.upstream_settings[service] = (name, setting.spec)
    if setting.not_applied():
        return document_status(
            document,
            "warning",
            f"{' and '.join(setting.not_applied())} read but not applied (a global limit needs "
            "an external rate limit service); the rest applies",
        )
    return document_status(document)


def _routes(spec: MeshSpec) -> Routes:
    grpc_routes = {
        (d.key.namespace, d.key.name): d.resource
        for d in spec.gateway_routes
        if isinstance(d.resource, gateway.GRPCRoute)
    }
    return Routes(spec.route_groups, spec.tcp_routes, grpc_routes)


def _target_status(spec: MeshSpec, document: Document, routes: Routes) -> Status:
    """Index the TrafficTarget ``document``'s grant; its status."""
    problems = spec.grants.add(document, routes)
    if not problems:
        return document_status(document)
    grant = spec.grants.of(document.key)
    state = "warning" if grant is not None and grant.rules else "error"
    return document_status(document, state, "; ".join(problems))


PATCHED_KINDS = frozenset({"TrafficTarget", "HTTPRouteGroup", "TCPRoute"})


def patch(
    built: MeshSpec, statuses: Mapping[str, Status], changes: Mapping[DocumentKey, Document | None]
) -> tuple[MeshSpec, set[str]]:
    """``built`` (a spec as :func:`build` made it, with its documents' ``statuses``) with
    the TrafficTargets, HTTPRouteGroups and TCPRoutes of ``changes`` (each one's new
    document, or None when it is gone) applied, and the keys of the statuses that moved.

    It equals a build from scratch of the documents the changes leave, as long as no
    document error names a changed key (errors are laid over the statuses by key), and
    costs what the changes touch: the edited documents and the targets naming an edited
    route. ``built`` is not changed (its grants are copied on write)."""
    if any(key.kind not in PATCHED_KINDS for key in changes):
        raise ValueError("only TrafficTargets, HTTPRouteGroups and TCPRoutes are patched")
    spec = replace(
        built,
        grants=built.grants.copy(),
        targets=dict(built.targets),
        route_groups=dict(built.route_groups),
        tcp_routes=dict(built.tcp_routes),
        statuses=dict(statuses),
    )
    moved = {str(key) for key in changes}
    edited_routes = set()
    for key, document in changes.items():
        if key.kind == "TrafficTarget":
            continue
        edited_routes.add((key.namespace, key.kind, key.name))
        named = (key.namespace, key.name)
        if key.kind == "HTTPRouteGroup":
            spec.route_groups.pop(named, None)
        else:
            spec.tcp_routes.pop(named, None)
        spec.statuses.pop(str(key), None)
        if document is None:
            continue
        if isinstance(document.resource, smi.HTTPRouteGroup):
            spec.route_groups[named] = document.resource
        else:
            spec.tcp_routes[named] = document.resource
        spec.statuses[str(key)] = document_status(document)
    routes = _routes(spec)
    targets = {key for key in changes if key.kind == "TrafficTarget"}
    for key in targets | spec.grants.naming(edited_routes):
        spec.grants.remove(key)
        target = changes[key] if key in changes else spec.targets[key]
        moved.add(str(key))
        if target is None:
            spec.targets.pop(key, None)
            spec.statuses.pop(str(key), None)
        else:
            spec.targets[key] = target
            spec.statuses[str(key)] = _target_status(spec, target, routes)
    return spec, moved
