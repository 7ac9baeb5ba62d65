"""Destinations: every known service as a discovery client sees it, versioned.

A discovery client (the Linkerd Destination API that proxy-cp serves) asks for a service by
name, not for an identity's view: what are its endpoints, and what profile applies to
requests for it. A :class:`Destination` is that answer's source: the service's addresses
and hosts, the clusters of its ports (their endpoints live in the shared clusters), the HTTP
routes the mesh's policies name for it (the rules of the producer HTTPRoutes and GRPCRoutes
attached to it, in precedence order, then the SMI matches), where its requests go instead
(the backends of those rules when they all agree, else its TrafficSplit's), and the ports
a Linkerd client treats as opaque TCP.

Consumer routes (those of another namespace) hold only for clients in that namespace; a
destination is one answer for every client, so it carries the producer's rules only.

:class:`Destinations` versions them: a destination's version is a digest of its record
and of its clusters' content versions (:mod:`~trellis_catalog.domain.model.contentversion`),
the same on every catalog replica and across restarts, so it moves when, and only when, one
of them does. The resource store (:mod:`.resources`) publishes them as
``destination/<namespace>/<name>``, in its one change log.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from trellis_catalog.domain.access.inbound import http_match
from trellis_catalog.domain.index.services import KnownService
from trellis_catalog.domain.model import contentversion
from trellis_catalog.domain.model.views import ClusterState, HttpMatch
from trellis_catalog.domain.routing.gateway import AttachedRule
from trellis_common.model import MeshService, ServiceAccount
from trellis_spec.mesh import MeshSpec
from trellis_spec.steps import Steps, drain

__all__ = ["Destination", "Destinations", "ProfileRoute", "build", "opaque_ports"]

#: Linkerd's default opaque ports (its ``proxy.opaquePorts`` value): SMTP, MySQL, Galera,
#: PostgreSQL, Redis, Elasticsearch, Memcached.
DEFAULT_OPAQUE_PORTS = (25, 587, 3306, 4444, 5432, 6379, 9300, 11211)
OPAQUE_PORTS_ANNOTATION = "config.linkerd.io/opaque-ports"


@dataclass(frozen=True, slots=True)
class ProfileRoute:
    name: str
    match: HttpMatch
    timeout: float = 0.0  # a Gateway API rule's timeouts.request (seconds; 0: none)
    port: int = 0  # a Gateway API parentRef's port (0: every port)


@dataclass(frozen=True, slots=True)
class Override:
    """Where a share of the requests for a destination goes instead (``port`` 0: the port
    asked for)."""

    service: MeshService
    weight: int
    port: int = 0


@dataclass(frozen=True, slots=True)
class Destination:
    service: MeshService
    addresses: tuple[str, ...]
    hosts: tuple[str, ...]
    clusters: tuple[str, ...]  # one per service port, in port order
    routes: tuple[ProfileRoute, ...]
    splits: tuple[Override, ...]
    split: str  # "<namespace>/<name>" of the TrafficSplit, or ""
    trust_domain: str
    retried: bool = False  # an OSM Retry policy (in force) names it
    opaque_ports: tuple[int, ...] = ()


def _addresses(known: KnownService, spec: MeshSpec) -> tuple[str, ...]:
    found = list(known.addresses)
    declared = spec.services.get(known.service)
    if declared is not None:
        cluster_ip = declared.spec.cluster_ip
        if cluster_ip and cluster_ip != "None":
            found.append(cluster_ip)
    return tuple(dict.fromkeys(found))


#: an endpoint's service account (read by C over a service's endpoints)
_ACCOUNT: Callable[[object], str] = operator.attrgetter("service_account")


def _routes(known: KnownService, spec: MeshSpec, account: str) -> tuple[ProfileRoute, ...]:
    """The HTTP matches of every TrafficTarget to an account the service runs as, then those
    of its TrafficSplit; the first of equal names wins."""
    namespace = known.service.namespace
    accounts = {account, *filter(None, map(_ACCOUNT, known.endpoints))}
    found: dict[str, ProfileRoute] = {}
    ports = {p.port for p in known.ports}
    for name in sorted(accounts):
        for grant in spec.grants_to(ServiceAccount(namespace, name)):
            if grant.port is not None and ports and grant.port not in ports:
                continue
            for rule in grant.rules:
                for match in rule.http:
                    found.setdefault(match.name, ProfileRoute(match.name, http_match(match)))
    split = spec.splits.get(known.service)
    for group_name in [m.name for m in split.spec.matches] if split else ():
        group = spec.route_groups.get((namespace, group_name))
        for match in group.spec.matches if group else ():
            found.setdefault(match.name, ProfileRoute(match.name, http_match(match)))
    return tuple(found[name] for name in sorted(found))


def _gateway_routes(rules: Sequence[AttachedRule]) -> tuple[ProfileRoute, ...]:
    """The producer rules' matches, in precedence order, with their request timeouts."""
    return tuple(
        ProfileRoute(rule.source, rule.match, rule.timeout or 0.0, rule.port or 0)
        for rule in rules
        if rule.consumer is None
    )


def _gateway_overrides(
    service: MeshService, rules: Sequence[AttachedRule]
) -> tuple[Override, ...] | None:
    """The backends of the producer rules, when every rule sends to the same ones (a profile
    has one set of overrides, not one per route); None when they differ or one is invalid.
    A rule that sends only to the parent itself overrides nothing: ``()``."""
    found: set[tuple[Override, ...]] = set()
    for rule in rules:
        if rule.consumer is not None or rule.redirect is not None or rule.direct_status:
            continue
        backends = []
        for backend in rule.backends:
            if backend.service is None:
                return None
            backends.append(Override(backend.service, backend.weight, backend.port))
        found.add(tuple(backends))
    if len(found) != 1:
        return None
    [chosen] = found
    if all(b.service == service for b in chosen):
        return ()
    return chosen


def opaque_ports(known: KnownService, spec: MeshSpec) -> tuple[int, ...]:
    """The declared Service's ``config.linkerd.io/opaque-ports`` (ports and ranges, ``a-b``),
    else Linkerd's defaults. Pods' annotations are not known here: a Service's is all."""
    declared = spec.services.get(known.service)
    annotation = declared.metadata.annotations.get(OPAQUE_PORTS_ANNOTATION) if declared else None
    if annotation is None:
        return DEFAULT_OPAQUE_PORTS
    found: set[int] = set()
    names = {p.name: p.port for p in known.ports if p.name}
    for part in annotation.split(","):
        item = part.strip()
        low, sep, high = item.partition("-")
        if sep and low.isdigit() and high.isdigit():
            found.update(range(int(low), min(int(high), 65535) + 1))
        elif item.isdigit():
            found.add(int(item))
        elif item in names:
            found.add(names[item])
    return tuple(sorted(p for p in found if 0 < p < 65536))


def build(
    known: KnownService,
    spec: MeshSpec,
    account: str,
    trust_domain: str,
    rules: Sequence[AttachedRule] = (),
) -> Destination:
    """``rules``: the Gateway API rules attached to the service (they take over from its
    TrafficSplit when they agree on their backends)."""
    split = spec.splits.get(known.service)
    backends: tuple[Override, ...] = tuple(
        Override(b.service, b.weight) for b in (split.weighted_services() if split else ())
    )
    split_name = spec.split_names.get(known.service, "")
    routed = _gateway_overrides(known.service, rules) if rules else None
    if routed is not None:
        backends, split_name = routed, ""
    return Destination(
        service=known.service,
        addresses=_addresses(known, spec),
        hosts=known.hosts,
        clusters=tuple(known.cluster_name(p.port) for p in known.ports),
        routes=_gateway_routes(rules) + _routes(known, spec, account),
        splits=backends,
        split=split_name,
        trust_domain=trust_domain,
        retried=spec.retried(known.service),
        opaque_ports=opaque_ports(known, spec),
    )


class Destinations:
    """Every known service's destination record and its content version."""

    def __init__(self) -> None:
        self.records: dict[MeshService, Destination] = {}
        self.versions: dict[MeshService, str] = {}

    def update(
        self,
        scope: Iterable[MeshService],
        services: Mapping[MeshService, KnownService],
        clusters: Mapping[str, ClusterState],
        record_of: Callable[[KnownService], Destination],
    ) -> list[tuple[MeshService, str]]:
        """Rebuild the destinations of ``scope``; returns those that changed (new, moved or
        gone, with version "") and their new versions."""
        return drain(self.update_steps(scope, services, clusters, record_of))

    def update_steps(
        self,
        scope: Iterable[MeshService],
        services: Mapping[MeshService, KnownService],
        clusters: Mapping[str, ClusterState],
        record_of: Callable[[KnownService], Destination],
    ) -> Steps[list[tuple[MeshService, str]]]:
        """:meth:`update` in steps: records are computed and compared a step per service,
        then those that moved are committed in one go."""
        moved: list[tuple[MeshService, Destination | None, str]] = []
        for service in sorted(set(scope), key=str):
            yield
            known = services.get(service)
            if known is None:
                if service in self.records:
                    moved.append((service, None, ""))
                continue
            record = record_of(known)
            version = contentversion.of(
                (
                    record,
                    tuple(
                        clusters[c].version if c in clusters else contentversion.ABSENT
                        for c in record.clusters
                    ),
                )
            )
            if self.versions.get(service) != version:
                moved.append((service, record, version))
        for service, new_record, version in moved:
            if new_record is None:
                del self.records[service]
                self.versions.pop(service, None)
            else:
                self.records[service] = new_record
                self.versions[service] = version
        return [(service, version) for service, _, version in moved]
