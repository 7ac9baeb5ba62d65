"""Who may call an identity, on which ports and routes: the inbound half of its policy.

Each port of the identity's own service gets the rules of the TrafficTargets that grant
its service account: their sources as SPIFFE ids, with HTTP matches on HTTP ports and the
TCPRoute ports on TCP ports (a TCPRoute on an HTTP port allows every request). A port no
grant covers keeps no rule, so it is denied unless the mesh is permissive (``allow_any``).

Kept apart from :mod:`.policy` because it reads only the grants *to* one account, while
the outbound half walks every destination the account may call; :mod:`.access` shares
:func:`http_match` to explain the same routes.
"""

from __future__ import annotations

from trellis_catalog.domain.services import KnownService, PortSpec, endpoint_port, spiffe_id
from trellis_catalog.domain.spec import Grant, MeshSpec
from trellis_catalog.domain.views import MATCH_ALL, HttpMatch, InboundPort, InboundRule
from trellis_common.documents import smi
from trellis_common.model import ServiceAccount


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
        found.append(
            InboundPort(
                port=port.port,
                target_port=target,
                protocol=port.protocol,
                name=port.name,
                rules=rules,
                allow_any=spec.permissive,
            )
        )
    return tuple(found)


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
