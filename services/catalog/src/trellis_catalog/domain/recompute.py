"""The recompute: from the dirty inputs to new services, clusters and policies.

Inputs only mark what they touch (:class:`Dirty`); :meth:`Recompute.apply` then does the
least work that keeps every answer equal to a computation from scratch:

1. the specification is rebuilt only when documents changed;
2. only the services in scope are re-indexed: all of them when a provider sent a full list,
   the ones a provider changed, and the ones a Service document names;
3. the clusters of those services are rebuilt (:class:`~trellis_catalog.domain.clusters.Clusters`);
4. policies are recomputed only when the specification, the proxies, or a service's shape
   (ports, location, hosts, reachability, account: not its endpoints' addresses) changed,
   and then only for the identities an access-policy edit concerns when that is all that
   changed; an equal new policy keeps the old object, so its view keeps its version.

An identity's service account is the latest onboarded proxy's, else the one most of its
service's endpoints run as, else the last one known (so policies do not flip while
workloads come and go), else the service's name.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from trellis_catalog.domain import destinations, edge, gateway
from trellis_catalog.domain import services as svc
from trellis_catalog.domain import spec as meshspec
from trellis_catalog.domain.clusters import Clusters
from trellis_catalog.domain.policy import PolicyBuilder
from trellis_catalog.domain.reports import ProviderReports
from trellis_catalog.domain.steps import Steps, drain
from trellis_catalog.domain.tcpports import tcp_port_conflicts
from trellis_catalog.domain.views import Identity, IdentityPolicy
from trellis_common.documents.base import Document, DocumentError, DocumentKey
from trellis_common.model import MeshService, ServiceAccount

log = logging.getLogger(__name__)

TARGET = "TrafficTarget"
POLICY_KINDS = frozenset({TARGET, "HTTPRouteGroup", "TCPRoute"})

Verdict = Callable[[Identity, Exception | None], None]  # a view built, or why it was not


class Onboarded(Protocol):
    """What the recompute reads of the proxies (a :class:`~.proxies.Proxies`)."""

    def account(self, identity: Identity) -> str | None: ...

    def identities(self) -> set[Identity]: ...


@dataclass
class Dirty:
    spec: bool = False
    services: bool = False  # every service: re-index all
    policies: bool = False
    changed: set[MeshService] = field(default_factory=set)  # only these services
    documents: dict[DocumentKey, Any] = field(default_factory=dict)  # changed: old resource


@dataclass(frozen=True, slots=True)
class Recomputed:
    identities: set[Identity]  # whose policy changed or went away
    clusters: set[str]  # the names of the clusters that changed
    policies: bool  # policies were recomputed: the views' references may have moved
    services: set[MeshService] | None = None  # re-indexed services; None: the spec moved


def _accept(identity: Identity, error: Exception | None) -> None:
    return None


class Recompute:
    def __init__(
        self,
        reports: ProviderReports,
        proxies: Onboarded,
        trust_domain: str = "cluster.local",
        cluster_domain: str = "cluster.local",
        verdict: Verdict = _accept,
    ) -> None:
        self._reports = reports
        self._proxies = proxies
        self._trust_domain = trust_domain
        self._cluster_domain = cluster_domain
        self._verdict = verdict
        self._documents: list[Document] = []
        self._errors: list[DocumentError] = []
        self._resources: dict[DocumentKey, Any] = {}
        self._first_seen: dict[DocumentKey, datetime] = {}  # a route's age without a timestamp
        self._grpc_ports: dict[MeshService, frozenset[int]] = {}
        self.routes = gateway.Resolved()
        self.dirty = Dirty(spec=True)
        self.spec = meshspec.build([])
        self._document_statuses: dict[str, meshspec.Status] = {}
        self.services: dict[MeshService, svc.KnownService] = {}
        self.clusters = Clusters()
        self.policies: dict[Identity, IdentityPolicy] = {}
        self._last_accounts: dict[MeshService, str] = {}
        self.last_recomputed = 0  # identities whose policy the last apply recomputed

    # -- inputs: they only mark -------------------------------------------------------

    def set_documents(self, documents: Iterable[Document], errors: Iterable[DocumentError]) -> None:
        """The whole specification; remembers each changed document's old resource."""
        self._documents = list(documents)
        self._errors = list(errors)
        resources = {d.key: d.resource for d in self._documents}
        now = datetime.now(UTC)
        self._first_seen = {k: self._first_seen.get(k, now) for k in resources}
        for key in resources.keys() | self._resources.keys():
            if resources.get(key) != self._resources.get(key):
                self.dirty.documents.setdefault(key, self._resources.get(key))
        self._resources = resources
        self.dirty.spec = True

    def mark(self, *, spec: bool = False, services: bool = False, policies: bool = False) -> None:
        self.dirty.spec |= spec
        self.dirty.services |= services
        self.dirty.policies |= policies

    def changed(self, service: MeshService) -> None:
        """Only ``service`` changed at a provider: only it is re-indexed."""
        self.dirty.changed.add(service)

    # -- queries -----------------------------------------------------------------------

    def account_of(self, service: MeshService) -> str:
        latest = self._proxies.account(Identity(service.namespace, service.name))
        if latest:
            return latest
        known = self.services.get(service)
        if known is not None:
            accounts = Counter(e.service_account for e in known.endpoints if e.service_account)
            if accounts:
                account = accounts.most_common(1)[0][0]
                self._last_accounts[service] = account
                return account
        return self._last_accounts.get(service, service.name)

    def identities(self) -> list[Identity]:
        found = {Identity(s.namespace, s.name) for s, k in self.services.items() if not k.external}
        found |= self._proxies.identities()
        return sorted(found)

    def builder(self) -> PolicyBuilder:
        return PolicyBuilder(
            self.spec,
            self.services,
            self.account_of,
            self._trust_domain,
            self._cluster_domain,
            self.routes,
        )

    def policy_for(self, identity: Identity, service_account: str = "") -> IdentityPolicy:
        """The policy of ``identity``, computed on demand if it is not known yet."""
        policy = self.policies.get(identity)
        if policy is None or (service_account and service_account != policy.service_account):
            account = service_account or self.account_of(MeshService(*identity))
            policy = self.builder().build(identity, account)
        return policy

    # -- the recompute -----------------------------------------------------------------

    def apply(self) -> Recomputed:
        """Apply every pending input; the dirty marks start over."""
        return drain(self.apply_steps())

    def apply_steps(self) -> Steps[Recomputed]:
        """:meth:`apply` in steps: it yields between services and between identities, so an
        event loop can serve others meanwhile (:meth:`Catalog.flush_in_steps`). Inputs that
        arrive between steps mark the next round: the marks were taken at the start."""
        dirty, self.dirty = self.dirty, Dirty()
        recompute_policies = dirty.spec or dirty.policies
        changed_shape = False
        scope: set[MeshService] = set()
        if dirty.spec:
            self.spec = yield from meshspec.build_steps(self._documents, self._errors)
            self._document_statuses = dict(self.spec.statuses)
            grpc_ports, self._grpc_ports = self._grpc_ports, self.spec.grpc_backends()
            # a port that became (or stopped being) a GRPCRoute's backend changes protocol
            scope = {s for s in grpc_ports.keys() | self._grpc_ports.keys()
                     if grpc_ports.get(s) != self._grpc_ports.get(s)}  # fmt: skip
        changed_clusters: set[str] = set()
        scope |= self._scope(dirty)
        if scope or dirty.spec:
            before = {s: self._shape(s) for s in scope}
            for service in scope:
                yield
                known = svc.known_service(
                    service,
                    self.spec.services.get(service),
                    self._reports.of(service).values(),
                    self._grpc_ports.get(service, frozenset()),
                )
                if known is None:
                    self.services.pop(service, None)
                else:
                    self.services[service] = known
            if any(before[s] != self._shape(s) for s in scope):
                recompute_policies = True  # ports, accounts or reachability moved
                changed_shape = True
            changed_clusters = yield from self.clusters.rebuild_steps(
                scope, self.services, self._trust()
            )
        if dirty.spec or changed_shape:
            self.routes = gateway.resolve(
                self.spec.gateway_routes, self.services, self._first_seen, self._cluster_domain
            )
            yield
            self.spec.statuses = self._resolved_statuses()
            yield
        touched: set[Identity] = set()
        if recompute_policies:
            targeted = None if dirty.policies or changed_shape else self._concerned(dirty)
            touched = yield from self._recompute_policies(targeted)
        return Recomputed(
            touched, changed_clusters, recompute_policies, None if dirty.spec else scope
        )

    def _scope(self, dirty: Dirty) -> set[MeshService]:
        if dirty.services:
            return set(self.services) | set(self.spec.services) | self._reports.services()
        if dirty.spec:
            # only Service documents feed the index; policies and the rest do not
            return dirty.changed | {
                MeshService(k.namespace, k.name) for k in dirty.documents if k.kind == "Service"
            }
        return dirty.changed

    def _recompute_policies(self, targeted: list[Identity] | None) -> Steps[set[Identity]]:
        """Recompute the policies of ``targeted`` (None: everyone's, and forget the
        identities that are gone); returns the identities whose policy changed."""
        touched: set[Identity] = set()
        builder = self.builder()
        yield
        identities = self.identities() if targeted is None else targeted
        if targeted is None:
            for identity in set(self.policies) - set(identities):
                del self.policies[identity]
                touched.add(identity)
        self.last_recomputed = len(identities)
        for identity in identities:
            yield
            try:
                account = self.account_of(MeshService(*identity))
                policy = builder.build(identity, account)
            except Exception as exc:  # one identity's bad input never stops the others
                log.exception("catalog.view_failed identity=%s", identity)
                self._verdict(identity, exc)
                continue  # its last good view, if any, stays in force
            self._verdict(identity, None)
            if policy != self.policies.get(identity):
                self.policies[identity] = policy
                touched.add(identity)
        return touched

    def _concerned(self, dirty: Dirty) -> list[Identity] | None:
        """The identities an edit of access policy concerns, or None for "all of them".

        When only TrafficTargets, HTTPRouteGroups and TCPRoutes changed, only the accounts
        they name (old and new versions) can see their policy change: sources gain or lose
        destinations, destinations gain or lose inbound rules. An HTTPRouteGroup that a
        TrafficSplit's ``matches`` names shapes the routes of every caller of the split's
        root: its edit concerns everyone. Anything else (Services,
        splits, ServiceEntries, MeshConfig) may move every identity's view.
        """
        if not dirty.documents or any(k.kind not in POLICY_KINDS for k in dirty.documents):
            return None
        routes = {(k.namespace, k.kind, k.name) for k in dirty.documents if k.kind != TARGET}
        split_groups = {
            (root.namespace, "HTTPRouteGroup", match.name)
            for root, split in self.spec.splits.items()
            for match in split.spec.matches
        }
        if routes & split_groups:  # a split's matches: the routes of every caller of its root
            return None
        targets: list[Any] = [old for k, old in dirty.documents.items() if k.kind == TARGET]
        for key, resource in self._resources.items():
            if key.kind != TARGET:
                continue
            if key in dirty.documents or any(
                (key.namespace, rule.kind, rule.name) in routes for rule in resource.spec.rules
            ):
                targets.append(resource)
        accounts: set[ServiceAccount] = set()
        for target in targets:
            if target is not None:
                accounts.add(target.destination_account())
                accounts.update(target.source_accounts())
        return [
            identity
            for identity in self.identities()
            if ServiceAccount(identity.namespace, self.account_of(MeshService(*identity)))
            in accounts
        ]

    def _shape(self, service: MeshService) -> tuple[object, ...] | None:
        """What a policy depends on of a service: not its endpoints' addresses, unless an
        IngressBackend admits traffic from them."""
        known = self.services.get(service)
        if known is None:
            return None
        sources = {s for _, p in self.spec.ingress_backends for s in p.source_services()}
        return (
            tuple(sorted(e.address for e in known.endpoints)) if service in sources else (),
            known.ports,
            known.location,
            known.export_to,
            known.hosts,
            bool(known.endpoints),
            self.account_of(service),
            frozenset(e.service_account for e in known.endpoints),
        )

    def _resolved_statuses(self) -> dict[str, meshspec.Status]:
        """The documents' statuses once resolved against the known services: Gateway API
        routes, OSM Egress and IngressBackend, TrafficSplits that routes take over, and each
        Service that loses a TCP port to another (for clients that may reach both), marked
        with a warning that names the winner."""
        statuses = dict(self._document_statuses)
        statuses.update(self.routes.statuses)  # Gateway API routes: resolved against services
        statuses.update(edge.statuses(self.spec, self.services, self._document_statuses))
        for root, name in self.spec.split_names.items():
            routed = sorted(
                {r.source.rsplit(" rule ", 1)[0] for r in self.routes.rules.get(root, ())}
            )
            key = f"TrafficSplit {name}"
            if routed and key in statuses and statuses[key].state in ("valid", "warning"):
                reason = (
                    f"{', '.join(routed)} attached to {root}: its rules take over from this split"
                )
                statuses[key] = replace(statuses[key], state="warning", reason=reason)
        for service, lost in tcp_port_conflicts(self.services, self.spec).items():
            key = f"Service {service}"
            status = statuses.get(key)
            if status is None or status.state != "valid":
                continue
            reason = "; ".join(
                f"TCP port {port} is also {winner}'s: a client that may reach both connects "
                f"to {winner} on it (a TrafficSplit root first, then by name; see "
                "`trellis policy check`)"
                for port, winner in lost
            )
            statuses[key] = replace(status, state="warning", reason=reason)
        return statuses

    def destination(self, known: svc.KnownService) -> destinations.Destination:
        account = self.account_of(known.service)
        return destinations.build(known, self.spec, account, self._trust())

    def _trust(self) -> str:
        settings = self.spec.settings
        return settings.trust_domain if settings and settings.trust_domain else self._trust_domain
