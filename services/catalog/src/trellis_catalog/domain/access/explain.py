"""Whether one service account may call one service, and why: the answer to CheckPolicy.

:func:`explain` reads the same snapshot a :class:`~.policy.PolicyBuilder` builds views
from, so the answer agrees with what the proxies enforce, but it answers one question in
words (which TrafficTargets, which routes, or why not) instead of building a whole view.
A TrafficSplit root is allowed when any of its weighted backends is.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from trellis_catalog.domain.access.inbound import http_match
from trellis_catalog.domain.access.policy import PolicyBuilder
from trellis_catalog.domain.model.views import MATCH_ALL, HttpMatch, Identity
from trellis_common.model import MeshService, ServiceAccount


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    reason: str
    policies: tuple[str, ...] = ()
    routes: tuple[HttpMatch, ...] = ()
    permissive: bool = False
    conflicts: tuple[str, ...] = ()  # TCP ports another destination takes from this one
    shaped_by: tuple[str, ...] = ()  # the routing and OSM policies that shape these calls


def explain(builder: PolicyBuilder, source: ServiceAccount, destination: MeshService) -> Decision:
    """Whether ``source`` may call ``destination``, by which TrafficTargets and routes, and
    which of its TCP ports another destination of ``source`` takes."""
    decision = _explain(builder, source, destination)
    if not decision.allowed:
        return decision
    decision = replace(decision, shaped_by=shaped_by(builder, source, destination))
    caller = builder.build(Identity(source.namespace, source.name), source.name)
    conflicts = tuple(
        f"TCP port {o.port}: {source} reaches {o.shadowed_by} on it, not {destination} "
        f"({o.shadowed_by} takes precedence: a TrafficSplit root first, then by name)"
        for o in caller.outbound
        if o.shadowed_by and MeshService(o.namespace, o.name) == destination
    )
    return replace(decision, conflicts=conflicts) if conflicts else decision


def shaped_by(
    builder: PolicyBuilder, source: ServiceAccount, destination: MeshService
) -> tuple[str, ...]:
    """Which documents shape ``source``'s calls to ``destination`` (beyond access): its
    Gateway API routes (those that hold for ``source``'s namespace), its TrafficSplit, the
    Retry for the pair, the destination's UpstreamTrafficSetting."""
    spec = builder.spec
    found = list(
        dict.fromkeys(
            f"{rule.source.rsplit(' rule ', 1)[0]} (routes)"
            for rule in builder.routes.for_client(destination, source.namespace)
        )
    )
    if destination in spec.splits and not found:  # routes take over from a split
        found.append(f"TrafficSplit {spec.split_names[destination]} (weights)")
    retry = spec.retry_for(source, destination)
    if retry is not None:
        found.append(f"Retry {retry[0]} (retryOn {retry[1].retry_on})")
    setting = spec.upstream_settings.get(destination)
    if setting is not None:
        name, settings = setting
        parts = ["connectionSettings"] if settings.connection_settings else []
        parts += ["outlierDetection"] if settings.outlier_detection else []
        local = settings.rate_limit.local if settings.rate_limit else None
        parts += ["rateLimit.local"] if local else []
        parts += ["httpRoutes"] if settings.http_routes else []
        found.append(f"UpstreamTrafficSetting {name} ({', '.join(parts) or 'nothing set'})")
    return tuple(found)


def _explain(builder: PolicyBuilder, source: ServiceAccount, destination: MeshService) -> Decision:
    spec = builder.spec
    known = builder.services.get(destination)
    if known is None and destination not in spec.splits:
        return Decision(False, f"service {destination} is not known to the mesh")
    if spec.permissive:
        return Decision(True, "permissive traffic policy mode is on (MeshConfig)", permissive=True)
    if destination in spec.splits:
        backends = [b.service for b in spec.splits[destination].weighted_services() if b.weight]
        decisions = [_explain(builder, source, backend) for backend in backends]
        allowed = [d for d in decisions if d.allowed]
        if not allowed:
            return Decision(
                False,
                f"{destination} is split by TrafficSplit {spec.split_names[destination]} and no "
                f"TrafficTarget lets {source} call any of its backends",
            )
        return Decision(
            True,
            f"through TrafficSplit {spec.split_names[destination]}",
            tuple(dict.fromkeys(p for d in allowed for p in d.policies)),
            tuple(dict.fromkeys(r for d in allowed for r in d.routes)),
        )
    accounts = builder.accounts(destination)
    grants = [g for a in accounts for g in spec.grants_to(a) if source in g.sources]
    account = ", ".join(str(a) for a in accounts)
    if not grants:
        return Decision(
            False,
            f"no TrafficTarget lets service account {source} call {account} "
            f"(the account{'s' if len(accounts) > 1 else ''} of {destination}); traffic is "
            "denied by default",
        )
    routes: list[HttpMatch] = []
    for grant in grants:
        for rule in grant.rules:
            routes += [http_match(m) for m in rule.http] + list(rule.grpc)
            if rule.tcp_all or rule.tcp_ports:
                routes.append(MATCH_ALL)
    return Decision(
        True,
        f"allowed to {', '.join(str(a) for a in dict.fromkeys(g.destination for g in grants))} "
        "by TrafficTarget " + ", ".join(g.policy for g in grants),
        tuple(g.policy for g in grants),
        tuple(dict.fromkeys(routes)),
    )
