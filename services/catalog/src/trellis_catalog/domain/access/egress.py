"""The mesh's edge: OSM ``Egress`` (calls out of the mesh) and ``IngressBackend`` (calls
into it from outside), resolved for one identity, with their statuses.

Egress (OSM's ``GetEgressTrafficMatches`` and ``buildHTTPRouteConfigs``)
    Only while MeshConfig ``traffic.enableEgress`` is off; with it on every host is
    reachable and Egress policies have no effect. The policies whose sources include the
    identity's service account are merged per (protocol, host, port): an ``http`` host
    allows the requests of the policies' HTTPRouteGroups (all of them when a policy names
    none); ``tcp`` (and ``https`` without hosts) allows the policies' ``ipAddresses`` (any
    address when a policy names none). A referenced HTTPRouteGroup that does not exist adds
    no match; a referenced UpstreamTrafficSetting that does not exist makes OSM ignore the
    whole policy, and so does Trellis.

IngressBackend (OSM's ``GetIngressTrafficMatchesForSvc``)
    A backend is a service of the policy's namespace and its *target* port (a service port
    number is accepted too). ``http`` admits plaintext from the source ranges: IPRange
    CIDRs and each endpoint address of a ``Service`` source. A Service source without
    endpoints makes OSM skip the whole policy (an empty range list would admit everyone),
    and so does Trellis. ``https`` admits mTLS clients whose certificate names an
    ``AuthenticatedPrincipal`` source, from the source ranges when there are any; with
    ``tls.skipClientCertValidation``, any client from the source ranges or for the
    ``sniHosts`` (without either it cannot be told from the mesh's traffic, and is not
    applied). The first policy by namespace/name that names a backend port takes it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from trellis_catalog.domain.inbound import http_match
from trellis_catalog.domain.services import KnownService, PortSpec
from trellis_catalog.domain.upstream import connection_settings
from trellis_catalog.domain.views import EgressRoute, HttpMatch, IngressRule
from trellis_common.documents import osm_access
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec.egress import egress_statuses, warned
from trellis_spec.mesh import MeshSpec
from trellis_spec.statuses import Status


@dataclass
class _Merged:
    policies: list[str] = field(default_factory=list)
    everything: bool = False  # a policy allows every request / address
    matches: dict[HttpMatch, None] = field(default_factory=dict)
    ranges: dict[str, None] = field(default_factory=dict)
    route: EgressRoute | None = None  # the first policy's protocol, host, port, settings


def _egress_matches(spec: MeshSpec, name: str, egress: osm_access.Egress) -> list[HttpMatch]:
    """The http requests an Egress allows; empty with route groups named: none of them."""
    namespace = name.partition("/")[0]
    found = []
    for group_name in egress.route_groups():
        group = spec.route_groups.get((namespace, group_name))
        if group is not None:
            found += [http_match(m) for m in group.spec.matches]
    return found


def egress_routes(spec: MeshSpec, source: ServiceAccount) -> tuple[EgressRoute, ...]:
    """What the Egress policies let ``source``'s workloads reach, one entry per
    (protocol, host, port), in a stable order."""
    if spec.egress:
        return ()
    merged: dict[tuple[str, str, int], _Merged] = {}
    for name, egress in spec.egresses:
        if source not in egress.source_accounts():
            continue
        connection = None
        setting_name = egress.traffic_setting()
        if setting_name is not None:
            namespace = name.partition("/")[0]
            setting = spec.traffic_settings.get((namespace, setting_name))
            if setting is None:
                continue  # OSM ignores the whole policy
            connection = connection_settings(f"{namespace}/{setting_name}", setting)
        http_all = not egress.route_groups()
        matches = _egress_matches(spec, name, egress)
        ranges = egress.spec.ip_addresses
        for port in egress.spec.ports:
            protocol = "tcp" if port.protocol == "tcp-server-first" else port.protocol
            hosts = egress.spec.hosts if protocol in ("http", "https") else ()
            for host in hosts or ("",):
                entry = merged.setdefault((protocol, host, port.number), _Merged())
                entry.policies.append(name)
                if entry.route is None:
                    entry.route = EgressRoute(
                        (), protocol, port.number, host, connection=connection
                    )
                if protocol == "http":
                    entry.everything |= http_all
                    entry.matches.update(dict.fromkeys(matches))
                elif not host:  # tcp, or https to any host: by destination address
                    entry.everything |= not ranges
                    entry.ranges.update(dict.fromkeys(ranges))
                else:
                    entry.everything = True
    found = []
    for key in sorted(merged):
        entry = merged[key]
        assert entry.route is not None
        if entry.route.protocol == "http" and not entry.everything and not entry.matches:
            continue  # every HTTPRouteGroup it names is missing: no request is allowed
        found.append(
            replace(
                entry.route,
                policies=tuple(dict.fromkeys(entry.policies)),
                matches=() if entry.everything else tuple(entry.matches),
                ip_ranges=() if entry.everything else tuple(entry.ranges),
            )
        )
    return tuple(found)


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


def statuses(
    spec: MeshSpec, services: Mapping[MeshService, KnownService], documents: Mapping[str, Status]
) -> dict[str, Status]:
    """The statuses of the Egress and IngressBackend documents (and of the
    UpstreamTrafficSettings an Egress names), resolved against the rest of the spec and
    the known services; ``documents`` are the statuses the documents got on their own."""
    found: dict[str, Status] = {}
    found.update(egress_statuses(spec, documents))
    found.update(_ingress_statuses(spec, services, documents))
    return found


def _ingress_statuses(
    spec: MeshSpec, services: Mapping[MeshService, KnownService], documents: Mapping[str, Status]
) -> dict[str, Status]:
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
