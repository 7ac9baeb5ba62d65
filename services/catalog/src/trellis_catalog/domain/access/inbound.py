"""Who may call an identity, on which ports and routes: the inbound half of its policy.

Each port of the identity's own service gets the rules of the TrafficTargets that grant
its service account: their sources as SPIFFE ids, with HTTP matches on HTTP ports and the
TCPRoute ports on TCP ports (a TCPRoute on an HTTP port allows every request). A port no
grant covers keeps no rule, so it is denied unless the mesh is permissive (``allow_any``).
An OSM UpstreamTrafficSetting of the service adds its local rate limits (:func:`rate_limits`),
which the service's own sidecars enforce, as OSM does.

A port may also admit calls from outside the mesh: the OSM ``IngressBackend`` rule
(:func:`ingress_rule`, OSM's ``GetIngressTrafficMatchesForSvc``; :func:`admitted` applies it
to an identity's ports). A backend is a service of the policy's namespace and its *target*
port (a service port number is accepted too). ``http`` admits plaintext from the source
ranges: IPRange CIDRs and each endpoint address of a ``Service`` source. A Service source
without endpoints makes OSM skip the whole policy (an empty range list would admit
everyone), and so does Trellis. ``https`` admits mTLS clients whose certificate names an
``AuthenticatedPrincipal`` source, from the source ranges when there are any; with
``tls.skipClientCertValidation``, any client from the source ranges or for the ``sniHosts``
(without either it cannot be told from the mesh's traffic, and is not applied). The first
policy by namespace/name that names a backend port takes it. :func:`ingress_statuses` says,
per IngressBackend, what of it does not hold and why.

Kept apart from :mod:`.policy` because it reads only the grants *to* one account, while
the outbound half walks every destination the account may call; :mod:`.explain` shares
:func:`http_match` to explain the same routes, and :mod:`.egress` to read an Egress's
HTTPRouteGroups.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import replace

from trellis_catalog.domain.index.services import KnownService, PortSpec, endpoint_port, spiffe_id
from trellis_catalog.domain.model.views import (
    MATCH_ALL,
    HttpMatch,
    InboundPort,
    InboundRule,
    IngressRule,
    LocalRateLimit,
)
from trellis_common.documents import osm, osm_access, smi
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec.egress import warned
from trellis_spec.grants import Grant
from trellis_spec.mesh import MeshSpec
from trellis_spec.statuses import Status


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


# -- IngressBackend: calls into the mesh from outside ----------------------------------


def _host_range(address: str) -> str:
    return str(ipaddress.ip_network(address))  # a single address: /32 or /128


def _backend(
    policy: osm_access.IngressBackend, service: MeshService, port: int, target: int
) -> osm_access.Backend | None:
    if policy.metadata.namespace != service.namespace:
        return None
    return next(
        (
            b
            for b in policy.spec.backends
            if b.name == service.name and b.port.number in (target, port)
        ),
        None,
    )


def source_ranges(
    policy: osm_access.IngressBackend, services: Mapping[MeshService, KnownService]
) -> tuple[str, ...] | None:
    """The client addresses a policy admits; None when a Service source has no endpoints
    (OSM then skips the policy)."""
    found = dict.fromkeys(policy.source_ranges())
    for source in policy.source_services():
        known = services.get(source)
        endpoints = known.endpoints if known is not None else ()
        if not endpoints:
            return None
        found.update(dict.fromkeys(_host_range(e.address) for e in endpoints))
    return tuple(found)


def ingress_rule(
    spec: MeshSpec,
    services: Mapping[MeshService, KnownService],
    service: MeshService,
    port: int,
    target: int,
) -> IngressRule | None:
    """The IngressBackend admission to ``service``'s ``port`` (target ``target``)."""
    for name, policy in spec.ingress_backends:
        backend = _backend(policy, service, port, target)
        if backend is None:
            continue
        ranges = source_ranges(policy, services)
        if ranges is None:
            return None
        https = backend.port.protocol == "https"
        sni = backend.tls.sni_hosts if https and backend.tls is not None else ()
        return IngressRule(
            policy=name,
            protocol=backend.port.protocol,
            source_ranges=ranges,
            principals=policy.principals() if https else (),
            sni_hosts=sni,
            skip_client_cert_validation=https and _skips(backend) and bool(ranges or sni),
        )
    return None


def admitted(
    spec: MeshSpec,
    services: Mapping[MeshService, KnownService],
    service: MeshService,
    ports: tuple[InboundPort, ...],
) -> tuple[InboundPort, ...]:
    """``service``'s inbound ``ports`` with what IngressBackends admit to them from outside
    the mesh."""
    if not spec.ingress_backends:
        return ports
    return tuple(
        replace(port, ingress=ingress_rule(spec, services, service, port.port, port.target_port))
        for port in ports
    )


def ingress_statuses(
    spec: MeshSpec, services: Mapping[MeshService, KnownService], documents: Mapping[str, Status]
) -> dict[str, Status]:
    """The statuses of the IngressBackend documents, resolved against the known services;
    ``documents`` are the statuses the documents got on their own."""
    found: dict[str, Status] = {}
    taken: dict[tuple[str, str, int], str] = {}
    for name, policy in spec.ingress_backends:
        key = f"IngressBackend {name}"
        namespace = name.partition("/")[0]
        problems = [f"{field} is read but not applied" for field in policy.not_applied()]
        state = "warning"
        for index, backend in enumerate(policy.spec.backends):
            where = f"spec.backends[{index}]"
            known = services.get(MeshService(namespace, backend.name))
            if known is None:
                problems.append(f"{where}: no service {namespace}/{backend.name} is known (yet)")
            elif not any(backend.port.number in (p.port, _target(p)) for p in known.ports):
                problems.append(
                    f"{where}.port.number: {backend.port.number} is no port of "
                    f"{namespace}/{backend.name}"
                )
            owner = taken.setdefault((namespace, backend.name, backend.port.number), name)
            if owner != name:
                problems.append(
                    f"{where}: IngressBackend {owner} already admits traffic to "
                    f"{backend.name}:{backend.port.number}; this one does not"
                )
            https = backend.port.protocol == "https"
            if https and _skips(backend):
                if (
                    not policy.source_ranges()
                    and not policy.source_services()
                    and not (backend.tls and backend.tls.sni_hosts)
                ):
                    problems.append(
                        f"{where}.tls.skipClientCertValidation is not applied: without a "
                        "Service or IPRange source or sniHosts, such clients cannot be told "
                        "from the mesh's; clients must present a mesh certificate"
                    )
            elif https and not policy.principals():
                problems.append(
                    f"{where}: https with no AuthenticatedPrincipal source admits no client"
                )
        empty = [s for s in policy.source_services() if not _endpoints(services, s)]
        if empty:
            state = "error"
            problems.insert(
                0,
                "endpoints not found for source service(s) "
                + ", ".join(map(str, empty))
                + ": no backend admits traffic until they have some, as in OSM",
            )
        elif (
            not policy.source_ranges()
            and not policy.source_services()
            and any(b.port.protocol == "http" for b in policy.spec.backends)
        ):
            problems.append(
                "an http backend with no Service or IPRange source admits plaintext from any "
                "address (OSM's behaviour)"
            )
        status = warned(documents, key, problems, state)
        if status is not None:
            found[key] = status
    return found


def _skips(backend: osm_access.Backend) -> bool:
    return backend.tls is not None and backend.tls.skip_client_cert_validation


def _target(port: PortSpec) -> int:
    return port.target if isinstance(port.target, int) else port.port


def _endpoints(services: Mapping[MeshService, KnownService], service: MeshService) -> bool:
    known = services.get(service)
    return known is not None and bool(known.endpoints)
