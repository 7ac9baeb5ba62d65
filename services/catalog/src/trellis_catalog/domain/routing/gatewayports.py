"""What a Gateway's Envoy serves, in its identity's view: ports, listeners, virtual hosts.

Each served listener (:mod:`.gateway_listeners`) becomes a :class:`GatewayServer` on its
port. Its virtual hosts are its own name (or ``*``) and every name its routes hold for,
except a name that a more specific listener on the same port owns: a request belongs to the
most specific listener whose hostname matches it (listener isolation). Within a listener, a
request for a name gets the rules of the routes that hold for that exact name first, then
those of wildcard names covering it (longest first), then the routes without hostnames, each
group in Gateway API precedence; a last route answers 404 (gRPC: UNIMPLEMENTED).

The gateway is a mesh client: its routes' backends become clusters reached over mesh mTLS
with the gateway's own identity, and the destinations' sidecars decide whether it may call
them (an SMI TrafficTarget whose source is the gateway's ServiceAccount, permissive mode,
or an IngressBackend admitting its principal). A backend that does not resolve is answered
like a mesh route's: 500 (HTTPRoute) or UNAVAILABLE (GRPCRoute) for its share.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from trellis_catalog.domain.index.services import KnownService, PortSpec
from trellis_catalog.domain.model.views import (
    MATCH_ALL,
    ClusterRef,
    GatewayPort,
    GatewayServer,
    GatewayTlsRoute,
    GatewayVirtualHost,
    Route,
    WeightedCluster,
)
from trellis_catalog.domain.routing import gamma
from trellis_catalog.domain.routing.gateway_listeners import GatewayListener, host_matches
from trellis_catalog.domain.routing.gateway_rules import NO_ROUTE
from trellis_catalog.domain.routing.gateways import GatewayRule, ServedGateway, TlsRule
from trellis_common.model import MeshService, ServiceAccount, WeightedService


class _Client:
    """The builder as the gateway's routes see it: every backend is called (the
    destination's sidecar decides)."""

    def __init__(
        self, builder: gamma.Builder, splits: Mapping[MeshService, tuple[WeightedService, ...]]
    ) -> None:
        self._builder = builder
        self._splits = splits
        self.services: Mapping[MeshService, KnownService] = builder.services

    def split(self, route: Route, source: ServiceAccount, clusters: dict[str, ClusterRef]) -> Route:
        """``route`` with each share that goes to a TrafficSplit's root spread over the
        split's backends (those with the root's port and endpoints, when any has), the
        shares kept in proportion (weights out of 10,000)."""
        shares: list[tuple[str, float, WeightedCluster]] = []
        total = sum(c.weight for c in route.clusters) or 1
        split_any = False
        for share in route.clusters:
            ref = clusters.get(share.cluster)
            root = MeshService(ref.namespace, ref.service) if ref is not None else None
            backends = self._backends(root, ref, source, clusters) if root and ref else []
            if not backends:
                shares.append((share.cluster, share.weight / total, share))
                continue
            split_any = True
            inner = sum(w for _, w in backends)
            for name, weight in backends:
                shares.append((name, share.weight / total * weight / inner, share))
        if not split_any:
            return route
        weighted = tuple(
            replace(share, cluster=name, weight=max(1, round(fraction * 10_000)))
            for name, fraction, share in shares
            if fraction > 0
        )
        return replace(route, clusters=weighted)

    def _backends(
        self,
        root: MeshService,
        ref: ClusterRef,
        source: ServiceAccount,
        clusters: dict[str, ClusterRef],
    ) -> list[tuple[str, int]]:
        candidates = []
        for backend in self._splits.get(root, ()):
            known = self.services.get(backend.service)
            port = next((p for p in known.ports if p.port == ref.port), None) if known else None
            if known is not None and port is not None and backend.weight > 0:
                candidates.append((known, port, backend.weight))
        # a backend with nothing to serve would answer 503s: left out while another serves
        serving = [c for c in candidates if c[0].endpoints or c[0].discovery != "STATIC"]
        found = []
        for known, port, weight in serving or candidates:
            backend_ref = self.cluster_ref(known, port, source)
            clusters[backend_ref.name] = backend_ref
            found.append((backend_ref.name, weight))
        return found

    def may_call(self, source: ServiceAccount, destination: MeshService) -> bool:
        return True

    def cluster_ref(
        self, known: KnownService, port: PortSpec, source: ServiceAccount
    ) -> ClusterRef:
        return self._builder.cluster_ref(known, port, source)

    def spiffe(self, services: list[MeshService]) -> tuple[str, ...]:
        return self._builder.spiffe(services)

    def names(self, known: KnownService, port: int) -> tuple[str, ...]:
        return self._builder.names(known, port)


def _specificity(hostname: str, name: str) -> tuple[int, int] | None:
    """How specifically a listener (or route) hostname matches ``name``: exactly (2), by a
    wildcard (1, longer first), as any name (0); None: not at all."""
    if not hostname or hostname == "*":
        return (0, 0)
    if hostname == name:
        return (2, len(hostname))
    if host_matches(hostname, name):
        return (1, len(hostname))
    return None


def ports(
    builder: gamma.Builder,
    served: ServedGateway,
    source: ServiceAccount,
    clusters: dict[str, ClusterRef],
    splits: Mapping[MeshService, tuple[WeightedService, ...]] | None = None,
) -> tuple[GatewayPort, ...]:
    """The gateway's ports; a backend that is a TrafficSplit's root is split as the split
    says (as for any client of the root), over the backends that have its port."""
    client = _Client(builder, splits or {})
    by_port: dict[int, list[GatewayListener]] = {}
    for listener in served.listeners:
        if listener.served:
            by_port.setdefault(listener.port, []).append(listener)
    found = []
    for number, listeners in sorted(by_port.items()):
        servers = []
        for listener in listeners:
            rules = served.rules.get(listener.name, [])
            others = [o for o in listeners if o is not listener]
            name = f"{served.namespace}/{served.name}/{listener.name}"
            if listener.protocol == "TLS":
                tls_rules = served.tls_rules.get(listener.name, [])
                passed = _tls_routes(client, listener, others, tls_rules, source, clusters)
                servers.append(
                    GatewayServer(name, listener.hostname, "Passthrough", (), (), passed)
                )
                continue
            hosts = _virtual_hosts(client, listener, others, rules, source, clusters)
            servers.append(
                GatewayServer(
                    listener=name,
                    hostname=listener.hostname,
                    tls_mode=listener.tls_mode,
                    certificates=listener.certificates,
                    virtual_hosts=hosts,
                )
            )
        found.append(GatewayPort(number, listeners[0].protocol, tuple(servers)))
    return tuple(found)


def _virtual_hosts(
    client: _Client,
    listener: GatewayListener,
    others: list[GatewayListener],
    rules: list[GatewayRule],
    source: ServiceAccount,
    clusters: dict[str, ClusterRef],
) -> tuple[GatewayVirtualHost, ...]:
    own = listener.hostname or "*"
    domains = dict.fromkeys([own, *(d for rule in rules for d in rule.domains)])
    if listener.protocol == "HTTP":  # HTTPS listeners are told apart by SNI first
        domains = {d: None for d in domains if not _owned_elsewhere(listener, others, d)}
    converted: dict[str, Route] = {}
    hosts = []
    for domain in sorted(domains, key=_domain_order):
        applicable: list[tuple[tuple[Any, ...], GatewayRule]] = []
        for rule in rules:
            best = max(
                (s for d in rule.domains if (s := _specificity(d, domain)) is not None),
                default=None,
            )
            if best is not None:
                applicable.append(((-best[0], -best[1], rule.precedence), rule))
        routes = []
        for _, rule in sorted(applicable, key=lambda item: item[0]):
            route = converted.get(rule.source + f"#{rule.match_index}")
            if route is None:
                route = gamma.route(client, rule.attached, source, clusters, set())
                route = client.split(route, source, clusters)
                converted[rule.source + f"#{rule.match_index}"] = route
            routes.append(route)
        routes.append(Route("no-route", MATCH_ALL, (), direct_status=NO_ROUTE))
        hosts.append(GatewayVirtualHost((domain,), tuple(routes)))
    return tuple(hosts)


def _tls_routes(
    client: _Client,
    listener: GatewayListener,
    others: list[GatewayListener],
    rules: list[TlsRule],
    source: ServiceAccount,
    clusters: dict[str, ClusterRef],
) -> tuple[GatewayTlsRoute, ...]:
    """A passthrough listener's TLSRoutes, the older first; a server name is the first
    route's that claims it, and not the listener's when a more specific one owns it."""
    taken: set[str] = set()
    found = []
    for rule in sorted(rules, key=lambda r: (r.created, r.source)):
        names = tuple(
            d for d in rule.domains if d not in taken and not _owned_elsewhere(listener, others, d)
        )
        taken.update(names)
        weighted = []
        for backend in rule.backends:
            known = client.services.get(backend.service) if backend.service else None
            port = next((p for p in known.ports if p.port == backend.port), None) if known else None
            if known is None or port is None:
                continue  # an invalid backend: its share has nowhere to go (the route's status)
            ref = client.cluster_ref(known, port, source)
            clusters[ref.name] = ref
            weighted.append(WeightedCluster(ref.name, backend.weight))
        if names and weighted:
            found.append(GatewayTlsRoute(names, tuple(weighted), rule.source))
    return tuple(found)


def _owned_elsewhere(listener: GatewayListener, others: list[GatewayListener], name: str) -> bool:
    """Another listener on the port matches ``name`` more specifically."""
    mine = _specificity(listener.hostname, name) or (-1, 0)
    return any(
        (theirs := _specificity(other.hostname, name)) is not None and theirs > mine
        for other in others
    )


def _domain_order(domain: str) -> tuple[int, int, str]:
    if domain == "*":
        return (2, 0, domain)
    if domain.startswith("*."):
        return (1, -len(domain), domain)
    return (0, 0, domain)
