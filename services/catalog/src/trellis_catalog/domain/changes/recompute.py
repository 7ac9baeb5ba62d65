"""The recompute: from the dirty inputs to new services, clusters and policies.

Inputs only mark what they touch (:class:`Dirty`); :meth:`Recompute.apply` then does the
least work that keeps every answer equal to a computation from scratch:

1. the specification is rebuilt only when documents changed, and only patched when the
   edit is of access policy alone (TrafficTargets, HTTPRouteGroups, TCPRoutes): the
   edited documents and the targets naming an edited route, nothing else;
2. only the services in scope are re-indexed: all of them when a provider sent a full list,
   the ones a provider changed, and the ones a Service document names;
3. the clusters of those services are rebuilt
   (:class:`~trellis_catalog.domain.index.clusters.Clusters`);
4. policies are recomputed only when the specification, the proxies, or a service's shape
   (ports, location, hosts, reachability, account: not its endpoints' addresses) changed,
   and then only for the identities an access-policy edit concerns when that is all that
   changed (found through an index of who runs as which account, with a builder that keeps
   what it learned of the services); an equal new policy keeps the old object, so its
   view keeps its version;
5. destinations are rebuilt for the services re-indexed, all of them when the spec was
   built, and for an access-policy edit only those running as a touched target's
   destination account (and the roots of splits whose matches name an edited group).

An identity's service account is the latest onboarded proxy's, else the one most of its
service's endpoints run as, else the last one known (so policies do not flip while
workloads come and go), else the service's name.
"""

from __future__ import annotations

import logging
import operator
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from trellis_catalog.domain.access import inbound
from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.changes.documents import SpecDocuments
from trellis_catalog.domain.changes.edits import AccessEdit
from trellis_catalog.domain.index import services as svc
from trellis_catalog.domain.index.clusters import Clusters
from trellis_catalog.domain.index.reports import ProviderReports
from trellis_catalog.domain.model.views import Identity, IdentityPolicy
from trellis_catalog.domain.publish import destinations
from trellis_catalog.domain.routing import gateway
from trellis_catalog.domain.routing.gateways import Gateways, resolve_gateways
from trellis_catalog.domain.routing.gateways import statuses as gateway_statuses
from trellis_catalog.domain.routing.tcpports import tcp_port_conflicts
from trellis_catalog.domain.routing.tlsroutes import attach_tls_routes
from trellis_common.documents.base import Document, DocumentError, DocumentKey
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec import mesh as meshspec
from trellis_spec import statuses
from trellis_spec.egress import egress_statuses
from trellis_spec.steps import Steps, drain

log = logging.getLogger(__name__)

#: services (their shapes) or marked documents handled between two steps of a flush
STEP = 500
#: an endpoint's service account (read by C over a service's endpoints)
_ACCOUNT: Callable[[Any], str] = operator.attrgetter("service_account")


Verdict = Callable[[Identity, Exception | None], None]  # a view built, or why it was not


class Onboarded(Protocol):
    """What the recompute reads of the proxies (a
    :class:`~trellis_catalog.domain.index.proxies.Proxies`)."""

    def account(self, identity: Identity) -> str | None: ...

    def identities(self) -> set[Identity]: ...


@dataclass
class Dirty:
    spec: bool = False
    services: bool = False  # every service: re-index all
    policies: bool = False
    changed: set[MeshService] = field(default_factory=set)  # only these services
    documents: dict[DocumentKey, Any] = field(default_factory=dict)  # changed: old resource
    errors: bool = False  # the document errors changed
    moved: bool = False  # a document moved (its source or position) but did not change


@dataclass(frozen=True, slots=True)
class Recomputed:
    identities: set[Identity]  # whose policy changed or went away
    clusters: set[str]  # the names of the clusters that changed
    policies: bool  # policies were recomputed: the views' references may have moved
    # the services whose destination may have moved; None: every one (the spec moved)
    services: set[MeshService] | None = None


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
        self._documents = SpecDocuments()
        self._route_ports: dict[MeshService, frozenset[tuple[int, str]]] = {}
        self.routes = gateway.Resolved()
        self.gateways = Gateways()
        self.dirty = Dirty(spec=True)
        self.spec = meshspec.build([])
        self._document_statuses: dict[str, statuses.Status] = {}
        self.services: dict[MeshService, svc.KnownService] = {}
        self.clusters = Clusters()
        self.policies: dict[Identity, IdentityPolicy] = {}
        self._last_accounts: dict[MeshService, str] = {}
        # who runs as which account, as of the last recompute of every policy (accounts
        # move only with what recomputes every policy: a service's shape, the proxies)
        self._by_account: dict[ServiceAccount, set[Identity]] = {}
        self._builder: PolicyBuilder | None = None  # the last recompute's
        self.last_recomputed = 0  # identities whose policy the last apply recomputed
        self.spec_updates: Counter[str] = Counter()  # "built" or "patched": how often

    # -- inputs: they only mark -------------------------------------------------------

    def set_documents(self, documents: Iterable[Document], errors: Iterable[DocumentError]) -> None:
        """The whole specification. It is compared with the last one by the next apply, in
        steps (tens of thousands of documents are tens of milliseconds of work)."""
        self._documents.set(documents, errors)
        self.dirty.spec = True

    def _take_documents(self) -> Steps[None]:
        """Compare the pending documents with the last ones (in steps), into the marks."""
        changes = yield from self._documents.take_steps()
        if not self.dirty.documents:  # nothing marked yet (a full build: 25,000 at once)
            self.dirty.documents = changes.documents
        else:
            for position, (key, old) in enumerate(changes.documents.items()):
                if position % STEP == 0:
                    yield
                self.dirty.documents.setdefault(key, old)
        self.dirty.errors |= changes.errors
        self.dirty.moved |= changes.moved

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
            accounts: Counter[str] = Counter(filter(None, map(_ACCOUNT, known.endpoints)))
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
        """The policy builder of the state the last apply left: the one it recomputed
        policies with. It stays right until an input moves what its caches hold (accounts,
        a service's shape, the spec), and every such input recomputes policies with a new
        one; so a question (``CheckPolicy``, a policy on demand) does not index every
        service again (a fifth of a second at 5,000 services, on the event loop)."""
        if self._builder is None:
            self._builder = drain(self._builder_steps())
        return self._builder

    def _builder_steps(self) -> Steps[PolicyBuilder]:
        builder = PolicyBuilder(
            self.spec,
            self.services,
            self.account_of,
            self._trust_domain,
            self._cluster_domain,
            self.routes,
            index=False,
            gateways=self.gateways,
        )
        yield from builder.index_steps()
        return builder

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
        yield from self._take_documents()
        dirty, self.dirty = self.dirty, Dirty()
        # documents set while the ones taken above were compared are the next round's
        self.dirty.spec = self._documents.pending
        if dirty.spec and not (dirty.documents or dirty.errors or dirty.moved):
            dirty.spec = False  # the same documents again (a rescan, a resync): nothing moved
        recompute_policies = dirty.spec or dirty.policies
        changed_shape = False
        scope: set[MeshService] = set()
        before = self.spec
        edit = AccessEdit(dirty.documents, self._documents.current)
        changes = None
        if dirty.spec and not (dirty.errors or dirty.moved):
            changes = edit.patch(before, self._documents.error_statuses)
        if changes is not None:  # access policy only: patched, at the cost of the edit
            self.spec, moved = meshspec.patch(before, self._document_statuses, changes)
            self._document_statuses = self.spec.statuses
            self.spec_updates["patched"] += 1
            yield
        elif dirty.spec:
            self.spec = yield from meshspec.build_steps(
                self._documents.documents, self._documents.errors
            )
            self._document_statuses = self.spec.statuses
            self.spec_updates["built"] += 1
            route_ports, self._route_ports = self._route_ports, self.spec.route_ports()
            # a port that became (or stopped being) a GRPCRoute's backend changes protocol
            scope = {s for s in route_ports.keys() | self._route_ports.keys()
                     if route_ports.get(s) != self._route_ports.get(s)}  # fmt: skip
        changed_clusters: set[str] = set()
        scope |= self._scope(dirty)
        if scope or dirty.spec:
            shapes: dict[MeshService, tuple[object, ...] | None] = {}
            for position, service in enumerate(scope):
                if position % STEP == 0:
                    yield
                shapes[service] = self._shape(service)
            for service in scope:
                yield
                known = svc.known_service(
                    service,
                    self.spec.services.get(service),
                    self._reports.of(service).values(),
                    self._route_ports.get(service, frozenset()),
                )
                if known is None:
                    self.services.pop(service, None)
                else:
                    self.services[service] = known
            for position, service in enumerate(scope):
                if position % STEP == 0:
                    yield
                if shapes[service] != self._shape(service):
                    recompute_policies = True  # ports, accounts or reachability moved
                    changed_shape = True
                    break
            changed_clusters = yield from self.clusters.rebuild_steps(
                scope, self.services, self._trust()
            )
        if (dirty.spec and changes is None) or changed_shape:
            self.gateways = resolve_gateways(self.spec)
            self.routes = gateway.resolve(
                self.spec.gateway_routes,
                self.services,
                self._documents.first_seen,
                self._cluster_domain,
                self.gateways,
            )
            attach_tls_routes(
                self.gateways, self.spec.tls_routes, self.services, self._documents.first_seen
            )
            yield
            self.spec.statuses = self._resolved_statuses()
            yield
        elif changes is not None:
            # no resolved status reads access policy: only the patched documents' move
            statuses = dict(before.statuses)
            for key in moved:
                statuses.pop(key, None)
                if key in self._document_statuses:
                    statuses[key] = self._document_statuses[key]
            self.spec.statuses = statuses
        touched: set[Identity] = set()
        destinations: set[MeshService] | None = None if dirty.spec else scope
        if recompute_policies:
            fresh = changes is None or dirty.policies or dirty.services or changed_shape
            if fresh or self._builder is None:
                builder = yield from self._builder_steps()
            else:  # what it learned of the services holds: only access policy moved
                builder = self._builder.respec(self.spec)
            targeted = (
                None
                if dirty.policies or changed_shape
                else edit.concerned(self.spec, self._by_account)
            )
            touched = yield from self._recompute_policies(targeted, builder)
            if changes is not None:
                destinations = scope | edit.destinations(self.spec, builder)
        return Recomputed(touched, changed_clusters, recompute_policies, destinations)

    def _scope(self, dirty: Dirty) -> set[MeshService]:
        if dirty.services:
            return set(self.services) | set(self.spec.services) | self._reports.services()
        if dirty.spec:
            # only Service documents feed the index; policies and the rest do not
            return dirty.changed | {
                MeshService(k.namespace, k.name) for k in dirty.documents if k.kind == "Service"
            }
        return dirty.changed

    def _recompute_policies(
        self, targeted: list[Identity] | None, builder: PolicyBuilder
    ) -> Steps[set[Identity]]:
        """Recompute the policies of ``targeted`` (None: everyone's, and forget the
        identities that are gone); returns the identities whose policy changed."""
        touched: set[Identity] = set()
        self._builder = builder
        yield
        identities = self.identities() if targeted is None else targeted
        by_account: dict[ServiceAccount, set[Identity]] = {}
        if targeted is None:
            for identity in set(self.policies) - set(identities):
                del self.policies[identity]
                touched.add(identity)
        self.last_recomputed = len(identities)
        for identity in identities:
            yield
            try:
                account = self.account_of(MeshService(*identity))
                by_account.setdefault(ServiceAccount(identity.namespace, account), set()).add(
                    identity
                )
                policy = builder.build(identity, account)
            except Exception as exc:  # one identity's bad input never stops the others
                log.exception("catalog.view_failed identity=%s", identity)
                self._verdict(identity, exc)
                continue  # its last good view, if any, stays in force
            self._verdict(identity, None)
            if policy != self.policies.get(identity):
                self.policies[identity] = policy
                touched.add(identity)
        if targeted is None:
            self._by_account = by_account
        return touched

    def _shape(self, service: MeshService) -> tuple[object, ...] | None:
        """What a policy depends on of a service, its cluster references included: not its
        endpoints' addresses, unless an IngressBackend admits traffic from them."""
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
            known.addresses,
            # what a policy's cluster references carry (discovery, TLS, names to verify)
            known.discovery,
            known.external,
            known.subject_alt_names,
            bool(known.endpoints),
            self.account_of(service),
            frozenset(map(_ACCOUNT, known.endpoints)),
        )

    def _resolved_statuses(self) -> dict[str, statuses.Status]:
        """The documents' statuses once resolved against the known services: Gateway API
        routes, OSM Egress and IngressBackend, TrafficSplits that routes take over, and each
        Service that loses a TCP port to another (for clients that may reach both), marked
        with a warning that names the winner."""
        statuses = dict(self._document_statuses)
        statuses.update(self.routes.statuses)  # Gateway API routes: resolved against services
        statuses.update(gateway_statuses(self.gateways, self.spec.gateways))
        statuses.update(egress_statuses(self.spec, self._document_statuses))
        statuses.update(inbound.ingress_statuses(self.spec, self.services, self._document_statuses))
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
        rules = self.routes.rules.get(known.service, ())
        return destinations.build(known, self.spec, account, self._trust(), rules)

    def _trust(self) -> str:
        settings = self.spec.settings
        return settings.trust_domain if settings and settings.trust_domain else self._trust_domain
