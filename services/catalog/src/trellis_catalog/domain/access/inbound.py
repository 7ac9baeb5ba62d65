"""Who may call an identity, on which ports and routes: the inbound half of its policy.

Each port of the identity's own service gets the rules of the TrafficTargets that grant
its service account: their sources as SPIFFE ids, with HTTP matches on HTTP ports and the
TCPRoute ports on TCP ports (a TCPRoute on an HTTP port allows every request). A port no
grant covers keeps no rule, so it is denied unless the mesh is permissive (``allow_any``).
An OSM UpstreamTrafficSetting of the service adds its local rate limits (:func:`rate_limits`),
which the service's own sidecars enforce, as OSM does.

Kept apart from :mod:`.policy` because it reads only the grants *to* one account, while
the outbound half walks every destination the account may call; :mod:`.access` shares
:func:`http_match` to explain the same routes.
"""

from __future__ import annotations

from trellis_catalog.domain.services import KnownService, PortSpec, endpoint_port, spiffe_id
from trellis_catalog.domain.views import (
    MATCH_ALL,
    HttpMatch,
    InboundPort,
    InboundRule,
    LocalRateLimit,
)
from trellis_common.documents import osm, smi
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec.grants import Grant
from trellis_spec.mesh import MeshSpec


def http_match(match: smi.HTTPMatch) -> HttpMatch:
    """An SMI HTTPRouteGroup match as the view carries it (``*`` methods: any method)."""
    methods = () if "*" in match.methods else tuple(match.methods)
    return HttpMatch(match.path_regex or ".*", methods, tuple(sorted(match.headers.items())))


def ports(
    spec: MeshSpec, known: KnownService | None, account: ServiceAccount, trust_domain: str
) -> tuple[InboundPort, ...]:
    """The inbound ports of ``known`` (the identity's own service) for ``account``."""
    if known is None:
        return ()
    grants = spec.grants_to(account)
    found = []
    for port in known.ports:
        target = target_port(known, port)
        rules = tuple(
            rule
            for grant in grants
            if grant.port is None or grant.port in (port.port, target)
            for rule in [_rule(grant, port, target, trust_domain)]
            if rule is not None
        )
        limit, route_limits = rate_limits(spec, known.service, port.protocol)
        found.append(
            InboundPort(
                port=port.port,
                target_port=target,
                protocol=port.protocol,
                name=port.name,
                rules=rules,
                allow_any=spec.permissive,
                rate_limit=limit,
                route_limits=route_limits,
            )
        )
    return tuple(found)


_UNITS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}


def _bucket(policy: str, limit: osm.LocalRateLimit, count: int) -> LocalRateLimit:
    """OSM's token bucket: ``count`` per unit, at most ``count + burst`` at once."""
    return LocalRateLimit(
        policy=policy,
        tokens_per_fill=count,
        max_tokens=count + limit.burst,
        fill_interval=_UNITS[limit.unit],
        status=limit.response_status_code or 0,
        response_headers=tuple((h.name, h.value) for h in limit.response_headers_to_add),
    )


def rate_limits(
    spec: MeshSpec, service: MeshService, protocol: str
) -> tuple[LocalRateLimit | None, tuple[tuple[str, LocalRateLimit], ...]]:
    """The UpstreamTrafficSetting's local limits for one of ``service``'s ports: requests
    on an HTTP port (and its httpRoutes' per-route limits), connections on a TCP port."""
    found = spec.upstream_settings.get(service)
    if found is None:
        return None, ()
    policy, setting = found
    local = setting.rate_limit.local if setting.rate_limit else None
    if protocol == "tcp":
        tcp = local.tcp if local else None
        limit = _bucket(policy, tcp, tcp.connections or 0) if tcp is not None else None
        return limit, ()
    http = local.http if local else None
    limit = _bucket(policy, http, http.requests or 0) if http is not None else None
    routes = tuple(
        (route.path, _bucket(policy, route.rate_limit.local, route.rate_limit.local.requests or 0))
        for route in setting.http_routes
        if route.rate_limit is not None and route.rate_limit.local is not None
    )
    return limit, routes


def target_port(known: KnownService, port: PortSpec) -> int:
    """The workload port behind a service port: an endpoint's, else the spec's target."""
    single = len(known.ports) == 1
    for endpoint in known.endpoints:
        number = endpoint_port(endpoint, port, single)
        if number is not None:
            return number
    return port.target if isinstance(port.target, int) else port.port


def _rule(grant: Grant, port: PortSpec, target: int, trust_domain: str) -> InboundRule | None:
    sources = tuple(sorted(spiffe_id(trust_domain, s.namespace, s.name) for s in grant.sources))
    http: list[HttpMatch] = []
    tcp: list[int] = []
    for rule in grant.rules:
        if (rule.http or rule.grpc) and port.protocol != "tcp":
            http += [http_match(m) for m in rule.http] + list(rule.grpc)
        elif rule.tcp_all or port.port in rule.tcp_ports or target in rule.tcp_ports:
            if port.protocol == "tcp":
                tcp.append(target)
            else:
                http.append(MATCH_ALL)  # a TCPRoute on an HTTP port allows every request
    if not http and not tcp:
        return None
    return InboundRule(grant.policy, sources, tuple(dict.fromkeys(http)), tuple(sorted(set(tcp))))
