"""One identity's policy: what it may call, on which routes, and who may call it.

- Deny by default: a destination appears in ``outbound`` only if a TrafficTarget lets the
  identity's service account call the destination's account, or the mesh is permissive.
- A TrafficSplit on a root service turns its routes into weighted clusters over the
  backends the caller may reach (weights of the others are dropped, not re-spread), that
  have the root's port (else skipped on that port, as OSM does), and that have endpoints,
  unless none has: traffic leaves a backend whose workloads are gone.
  Its ``matches`` (v1alpha3+) split only matching requests; the rest go to the root when
  the caller may reach it, else to the split as well.
- ServiceEntries: MESH_INTERNAL hosts are destinations like any service; MESH_EXTERNAL
  hosts are external services for the namespaces they are exported to.
- Inbound: each port of the identity's own service, with the TrafficTargets' sources and
  routes on it (HTTP matches on HTTP ports; TCPRoute ports on TCP ports), and what OSM
  IngressBackends admit to it from outside the mesh: :mod:`.inbound`.
- Egress: what OSM Egress policies let it reach outside the mesh: :mod:`.egress`.

Why a call is allowed or denied, in words (CheckPolicy), is :mod:`.explain`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace

from trellis_catalog.domain.access import egress, inbound
from trellis_catalog.domain.access.inbound import http_match
from trellis_catalog.domain.access.upstream import connection_settings, seconds
from trellis_catalog.domain.index.services import KnownService, PortSpec, spiffe_id
from trellis_catalog.domain.model.views import (
    MATCH_ALL,
    ClusterRef,
    ExternalService,
    Identity,
    IdentityPolicy,
    MeshSettings,
    OutboundService,
    RetryPolicy,
    Route,
    Tracing,
    WeightedCluster,
)
from trellis_catalog.domain.routing import gamma, gateway, gatewayports
from trellis_catalog.domain.routing.gateways import Gateways, resolve_gateways
from trellis_catalog.domain.routing.tcpports import shadow_tcp
from trellis_catalog.domain.routing.tlsroutes import attach_tls_routes
from trellis_common.documents import smi
from trellis_common.model import MeshService, ServiceAccount, WeightedService
from trellis_spec.mesh import MeshSpec
from trellis_spec.steps import Steps, drain

AccountOf = Callable[[MeshService], str]
STEP = 500  # services indexed between two steps


def _same_port(known: KnownService, port: PortSpec) -> PortSpec | None:
    """The backend's port that carries the root's ``port``: the same number, or none.

    A backend without the root's port is left out of the split on that port, and the other
    backends' weights then share all of it (Envoy's weights are relative), as OSM does;
    ``docs/osm-compatibility.md``."""
    for candidate in known.ports:
        if candidate.port == port.port:
            return candidate
    return None


class PolicyBuilder:
    """Computes policies against one snapshot of the spec and the known services."""

    def __init__(
        self,
        spec: MeshSpec,
        services: Mapping[MeshService, KnownService],
        account_of: AccountOf,
        trust_domain: str,
        cluster_domain: str = "cluster.local",
        routes: gateway.Resolved | None = None,
        *,
        index: bool = True,
        gateways: Gateways | None = None,
    ) -> None:
        self.spec = spec
        self.services = services
        self.account_of = account_of
        settings = spec.settings
        self.trust_domain = (
            settings.trust_domain if settings and settings.trust_domain else trust_domain
        )
        self.cluster_domain = cluster_domain
        traced = settings.tracing if settings else None
        tracing = Tracing(traced.address, traced.port, traced.endpoint) if traced else None
        failover = settings.locality_failover if settings else False
        self.mesh = MeshSettings(
            self.trust_domain, spec.permissive, spec.egress, tracing, locality_failover=failover
        )
        # Computed once per builder, not once per (identity, destination): a build walks
        # only the accounts a source may call, so it grows with the policies, not N².
        self._accounts: dict[MeshService, ServiceAccount] = {}
        self._workload_accounts: dict[MeshService, tuple[ServiceAccount, ...]] = {}
        self._by_account: dict[ServiceAccount, list[MeshService]] = {}
        # by name: a builder outlives endpoint changes (see respec), so looked up when used
        self._external_services: list[MeshService] = []
        self._splits = [
            (root, split, split.weighted_services()) for root, split in spec.splits.items()
        ]
        # Which splits an account's callers may reach (through the root or a backend), so a
        # build looks only at those: a split no allowed account touches yields nothing.
        self._splits_by_account: dict[ServiceAccount, list[int]] = {}
        self._spiffe_ids: dict[MeshService, str] = {}
        # What does not depend on the caller but on what of the service it may reach is
        # built once per builder and shared by every identity's policy (frozen values).
        self._refs: dict[tuple[MeshService, PortSpec, tuple[str, ...]], ClusterRef] = {}
        self._directs: dict[
            tuple[MeshService, tuple[str, ...]], tuple[list[ClusterRef], list[OutboundService]]
        ] = {}
        if gateways is None and routes is None and spec.gateways:
            gateways = resolve_gateways(spec)
        self.gateways = gateways
        self.routes = routes or gateway.resolve(
            spec.gateway_routes, services, {}, cluster_domain, gateways
        )
        if routes is None and gateways is not None:
            attach_tls_routes(gateways, spec.tls_routes, services, {})
        if index:
            drain(self.index_steps())

    def index_steps(self) -> Steps[None]:
        """Index the services by the accounts they run as, and the splits by the accounts
        they reach, in steps (a builder made with ``index=False`` needs it before use)."""
        for position, (service, known) in enumerate(self.services.items()):
            if position % STEP == 0:
                yield
            if known.external:
                self._external_services.append(service)
            else:
                for account in self.accounts(service):
                    self._by_account.setdefault(account, []).append(service)
        for position, (root, _, backends) in enumerate(self._splits):
            if position % STEP == 0:
                yield
            touched = [root, *(b.service for b in backends if b.weight > 0)]
            for account in {a for service in touched for a in self.accounts(service)}:
                self._splits_by_account.setdefault(account, []).append(position)

    def respec(self, spec: MeshSpec) -> PolicyBuilder:
        """A builder for ``spec``, which differs from this one's only in its TrafficTargets,
        HTTPRouteGroups and TCPRoutes, against the same services and accounts: it shares
        what this one learned of the services (which reads none of those)."""
        respecced = copy.copy(self)
        respecced.spec = spec
        return respecced

    def running_as(self, accounts: Collection[ServiceAccount]) -> set[MeshService]:
        """The services some of whose workloads run as one of ``accounts``."""
        found = {s for account in accounts for s in self._by_account.get(account, ())}
        found.update(
            s for s in self._external_services if any(a in accounts for a in self.accounts(s))
        )
        return found

    def account(self, service: MeshService) -> ServiceAccount:
        found = self._accounts.get(service)
        if found is None:
            found = self._accounts[service] = ServiceAccount(
                service.namespace, self.account_of(service)
            )
        return found

    def accounts(self, service: MeshService) -> tuple[ServiceAccount, ...]:
        """Every account the service's workloads run as (an endpoint without one runs as
        the service's account), the service's account first."""
        found = self._workload_accounts.get(service)
        if found is None:
            found = self._workload_accounts[service] = self._find_accounts(service)
        return found

    def _find_accounts(self, service: MeshService) -> tuple[ServiceAccount, ...]:
        main = self.account(service)
        known = self.services.get(service)
        found = dict.fromkeys([main])
        for endpoint in known.endpoints if known is not None else ():
            if endpoint.service_account and endpoint.service_account != main.name:
                found[ServiceAccount(service.namespace, endpoint.service_account)] = None
        return tuple(found)

    def may_call(self, source: ServiceAccount, destination: MeshService) -> bool:
        """Some workload of ``destination`` runs as an account ``source`` may call."""
        if self.spec.permissive:
            return True
        allowed = self.spec.grants.allowed(source)
        return any(a in allowed for a in self.accounts(destination))

    def reachable(self, source: ServiceAccount, destination: MeshService) -> tuple[str, ...]:
        """The accounts of ``destination``'s workloads that ``source`` may call, when not all
        of them (empty: every endpoint). OSM sends a client only those endpoints; "" stands
        for endpoints that name no account (they run as the service's)."""
        accounts = self.accounts(destination)
        if self.spec.permissive or len(accounts) == 1:
            return ()  # all of one account, or none (then it is not called at all)
        allowed = self.spec.grants.allowed(source)
        reachable = [a for a in accounts if a in allowed]
        if len(reachable) == len(accounts):
            return ()
        names = {a.name for a in reachable}
        if self.account(destination) in reachable:
            names.add("")
        return tuple(sorted(names))

    def names(self, known: KnownService, port: int) -> tuple[str, ...]:
        """Every name a client may use for ``known`` on ``port``."""
        return gateway.hostnames(known.service, port, self.cluster_domain, known.hosts)

    def _callable(self, source: ServiceAccount) -> list[MeshService]:
        if self.spec.permissive:
            return list(self.services)
        found: dict[MeshService, None] = {}
        for account in self.spec.grants.allowed(source):
            found.update(dict.fromkeys(self._by_account.get(account, ())))
        return list(found)

    def _reachable_splits(
        self, source: ServiceAccount
    ) -> list[tuple[MeshService, smi.TrafficSplit, tuple[WeightedService, ...]]]:
        if self.spec.permissive:
            return self._splits
        positions: set[int] = set()
        for account in self.spec.grants.allowed(source):
            positions.update(self._splits_by_account.get(account, ()))
        return [self._splits[p] for p in sorted(positions)]

    def cluster_ref(
        self, known: KnownService, port: PortSpec, source: ServiceAccount
    ) -> ClusterRef:
        return self._cluster_ref(known, port, self.reachable(source, known.service))

    def _cluster_ref(
        self, known: KnownService, port: PortSpec, accounts: tuple[str, ...]
    ) -> ClusterRef:
        key = (known.service, port, accounts)
        ref = self._refs.get(key)
        if ref is None:
            ref = known.cluster_ref(port)
            if accounts:
                ref = replace(ref, accounts=accounts)
            setting = self.spec.upstream_settings.get(known.service)
            if setting is not None:
                ref = replace(ref, connection=connection_settings(*setting))
            self._refs[key] = ref
        return ref

    def build(self, identity: Identity, service_account: str) -> IdentityPolicy:
        me = MeshService(identity.namespace, identity.service)
        source = ServiceAccount(identity.namespace, service_account)
        clusters: dict[str, ClusterRef] = {}
        outbound: list[OutboundService] = []
        routed = {
            parent: rules
            for parent in self.routes.rules
            if (rules := self.routes.for_client(parent, identity.namespace))
        }
        for service in self._callable(source):
            known = self.services[service]
            if known.external or not known.exported_to(identity.namespace):
                continue
            if service in self.spec.splits or service in routed:
                continue  # handled with its root or its Gateway API routes below
            outbound += self._direct(known, source, clusters)
        for root, split, backends in self._reachable_splits(source):
            if root not in routed:  # Gateway API routes on a root take over from its split
                outbound += self._split(root, split, backends, source, clusters)
        for parent, rules in routed.items():
            known = self.services[parent]
            if known.exported_to(identity.namespace):
                outbound += gamma.outbound(self, known, rules, source, clusters)
        outbound = shadow_tcp([self._retried(o, source) for o in outbound], self.spec)
        external = self._external(identity.namespace, clusters)
        served = self.gateways.served.get(identity) if self.gateways is not None else None
        gateway_ports = (
            gatewayports.ports(
                self, served, source, clusters, {root: b for root, _, b in self._splits}
            )
            if served
            else ()
        )
        return IdentityPolicy(
            identity=identity,
            service_account=service_account,
            spiffe_id=spiffe_id(self.trust_domain, identity.namespace, service_account),
            mesh=self.mesh,
            outbound=tuple(sorted(outbound, key=lambda o: (o.namespace, o.name, o.port))),
            external=tuple(external),
            inbound=inbound.admitted(
                self.spec,
                self.services,
                me,
                inbound.ports(self.spec, self.services.get(me), source, self.trust_domain),
            ),
            clusters=tuple(clusters[name] for name in sorted(clusters)),
            egress=egress.egress_routes(self.spec, source),
            gateway=gateway_ports,
        )

    # -- outbound ---------------------------------------------------------------------

    def _retried(self, outbound: OutboundService, source: ServiceAccount) -> OutboundService:
        """``outbound`` with the Retry policy for ``source``'s calls to it, if one applies
        (on every route: OSM applies it per upstream service); TCP has no retries."""
        if outbound.protocol == "tcp" or not self.spec.retry_enabled:
            return outbound
        found = self.spec.retry_for(source, MeshService(outbound.namespace, outbound.name))
        if found is None:
            return outbound
        name, policy = found
        retry = RetryPolicy(
            policy=name,
            retry_on=policy.retry_on,
            num_retries=policy.num_retries,
            per_try_timeout=seconds(policy.per_try_timeout),
            backoff_base_interval=seconds(policy.retry_backoff_base_interval),
        )
        return replace(outbound, retry=retry)

    def spiffe(self, services: list[MeshService]) -> tuple[str, ...]:
        found = set()
        for service in services:
            spiffe = self._spiffe_ids.get(service)
            if spiffe is None:
                account = self.account(service)
                spiffe = self._spiffe_ids[service] = spiffe_id(
                    self.trust_domain, account.namespace, account.name
                )
            found.add(spiffe)
        return tuple(sorted(found))

    def _direct(
        self, known: KnownService, source: ServiceAccount, clusters: dict[str, ClusterRef]
    ) -> list[OutboundService]:
        accounts = self.reachable(source, known.service)
        shared = self._directs.get((known.service, accounts))
        if shared is None:
            shared = self._directs[known.service, accounts] = self._direct_to(known, accounts)
        refs, found = shared
        for ref in refs:
            clusters[ref.name] = ref
        return list(found)

    def _direct_to(
        self, known: KnownService, accounts: tuple[str, ...]
    ) -> tuple[list[ClusterRef], list[OutboundService]]:
        refs, found = [], []
        for port in known.ports:
            ref = self._cluster_ref(known, port, accounts)
            refs.append(ref)
            found.append(
                OutboundService(
                    namespace=known.service.namespace,
                    name=known.service.name,
                    port=port.port,
                    protocol=port.protocol,
                    hostnames=self.names(known, port.port),
                    routes=(Route("default", MATCH_ALL, (WeightedCluster(ref.name, 100),)),),
                    spiffe_ids=self.spiffe([known.service]),
                    addresses=known.addresses,
                )
            )
        return refs, found

    def _split(
        self,
        root: MeshService,
        split: smi.TrafficSplit,
        split_backends: tuple[WeightedService, ...],
        source: ServiceAccount,
        clusters: dict[str, ClusterRef],
    ) -> list[OutboundService]:
        backends = [
            (b, self.services.get(b.service))
            for b in split_backends
            if b.weight > 0 and self.may_call(source, b.service)
        ]
        reachable = [(b, k) for b, k in backends if k is not None]
        # A backend with no endpoint left (deregistered, expired) would turn its share of
        # the traffic into 503s: leave it out while another backend can serve.
        serving = [(b, k) for b, k in reachable if k.endpoints or k.discovery != "STATIC"]
        if serving:
            reachable = serving
        root_known = self.services.get(root)
        if not reachable and not (root_known and self.may_call(source, root)):
            return []
        if root_known and root_known.ports:
            ports = root_known.ports
        else:  # a root without ports (headless, not reported yet) takes a backend's
            ports = reachable[0][1].ports if reachable else ()
        found = []
        for port in ports:
            weighted = []
            for backend, known in reachable:
                backend_port = _same_port(known, port)
                if backend_port is None:
                    continue
                ref = self.cluster_ref(known, backend_port, source)
                clusters[ref.name] = ref
                weighted.append(WeightedCluster(ref.name, backend.weight))
            if not weighted:
                continue
            routes = []
            group_names = [m.name for m in split.spec.matches]
            for name in group_names:
                group = self.spec.route_groups.get((root.namespace, name))
                for match in group.spec.matches if group else ():
                    routes.append(Route(f"{name}/{match.name}", http_match(match), tuple(weighted)))
            if not routes or port.protocol == "tcp":  # HTTP matches cannot select TCP
                routes = [Route("split", MATCH_ALL, tuple(weighted))]
            elif root_known is not None and self.may_call(source, root):
                ref = self.cluster_ref(root_known, port, source)
                clusters[ref.name] = ref
                routes.append(Route("default", MATCH_ALL, (WeightedCluster(ref.name, 100),)))
            else:
                routes.append(Route("split", MATCH_ALL, tuple(weighted)))
            found.append(
                OutboundService(
                    namespace=root.namespace,
                    name=root.name,
                    port=port.port,
                    protocol=port.protocol,
                    hostnames=gateway.hostnames(root, port.port, self.cluster_domain, ()),
                    routes=tuple(routes),
                    spiffe_ids=self.spiffe(
                        [b.service for b, _ in reachable]
                        + ([root] if root_known is not None and self.may_call(source, root) else [])
                    ),
                    addresses=root_known.addresses if root_known is not None else (),
                )
            )
        return found

    def _external(self, namespace: str, clusters: dict[str, ClusterRef]) -> list[ExternalService]:
        found = []
        for service in self._external_services:
            known = self.services.get(service)
            if known is None or not known.exported_to(namespace):
                continue
            for port in known.ports:
                ref = known.cluster_ref(port)
                clusters[ref.name] = ref
                for host in known.hosts or (known.service.name,):
                    found.append(
                        ExternalService(
                            host,
                            port.port,
                            port.sent_as or port.protocol,
                            ref.name,
                            known.addresses,
                            f"{known.service.namespace}/{known.service.name}",
                        )
                    )
        return sorted(found, key=lambda e: (e.host, e.port))
