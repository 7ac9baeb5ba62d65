"""A client's routes to a Service that Gateway API routes attach to (GAMMA).

The rules :mod:`.gateway` resolved for the parent become the client's routes on each of
the parent's HTTP ports, in precedence order, then a last route that answers 404 (gRPC:
UNIMPLEMENTED) to what no rule matches. Access still applies (deny by default): a backend
the client may not call is answered like an invalid one, with the route's error status
(gRPC UNAVAILABLE, HTTP 500) for its share, so the weights hold; a mirror it may not call is
dropped. The parent is a destination of the client when the client may call it or any of
its rules' backends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from trellis_catalog.domain.index.services import KnownService, PortSpec
from trellis_catalog.domain.model.views import (
    MATCH_ALL,
    ClusterRef,
    Mirror,
    OutboundService,
    Route,
    WeightedCluster,
)
from trellis_catalog.domain.routing.gateway import AttachedRule
from trellis_catalog.domain.routing.gateway_rules import GRPC_UNAVAILABLE, HTTP_INVALID, NO_ROUTE
from trellis_common.model import MeshService, ServiceAccount


class Builder(Protocol):
    services: Mapping[MeshService, KnownService]

    def may_call(self, source: ServiceAccount, destination: MeshService) -> bool: ...

    def cluster_ref(
        self, known: KnownService, port: PortSpec, source: ServiceAccount
    ) -> ClusterRef: ...

    def spiffe(self, services: list[MeshService]) -> tuple[str, ...]: ...

    def names(self, known: KnownService, port: int) -> tuple[str, ...]: ...


def outbound(
    builder: Builder,
    parent: KnownService,
    rules: list[AttachedRule],
    source: ServiceAccount,
    clusters: dict[str, ClusterRef],
) -> list[OutboundService]:
    """The client's destinations for the parent's ports (one per port with something the
    client may reach)."""
    found = []
    callable_parent = builder.may_call(source, parent.service)
    for port in parent.ports:
        applicable = [r for r in rules if r.port in (None, port.port)]
        targets: set[MeshService] = set()
        if applicable and port.protocol != "tcp":
            routes = [route(builder, rule, source, clusters, targets) for rule in applicable]
            routes.append(Route("no-route", MATCH_ALL, (), direct_status=NO_ROUTE))
        elif callable_parent:
            ref = builder.cluster_ref(parent, port, source)
            clusters[ref.name] = ref
            routes = [Route("default", MATCH_ALL, (WeightedCluster(ref.name, 100),))]
        else:
            continue
        if not callable_parent and not targets:
            continue
        found.append(
            OutboundService(
                namespace=parent.service.namespace,
                name=parent.service.name,
                port=port.port,
                protocol=port.protocol,
                hostnames=builder.names(parent, port.port),
                routes=tuple(routes),
                spiffe_ids=builder.spiffe(
                    sorted(targets | ({parent.service} if callable_parent else set()), key=str)
                ),
                addresses=parent.addresses,
            )
        )
    return found


def route(
    builder: Builder,
    rule: AttachedRule,
    source: ServiceAccount,
    clusters: dict[str, ClusterRef],
    targets: set[MeshService],
) -> Route:
    error = GRPC_UNAVAILABLE if rule.grpc else HTTP_INVALID
    weighted = []
    for backend in rule.backends:
        ref = _reach(builder, backend.service, backend.port, source, clusters)
        if ref is None:
            weighted.append(WeightedCluster("", backend.weight))
            continue
        targets.add(MeshService(ref.namespace, ref.service))
        weighted.append(
            WeightedCluster(
                ref.name, backend.weight, backend.request_headers, backend.response_headers
            )
        )
    mirrors = []
    for mirror in rule.mirrors:
        ref = _reach(builder, mirror.service, mirror.port, source, clusters)
        if ref is not None:
            targets.add(mirror.service)
            mirrors.append(Mirror(ref.name, mirror.numerator, mirror.denominator))
    direct = rule.direct_status
    if not direct and rule.redirect is None and not any(c.cluster for c in weighted):
        direct = error  # nothing to forward to: the whole rule answers the error
    return Route(
        name=f"{rule.source} match {rule.precedence[-1]}",
        match=rule.match,
        clusters=tuple(weighted) if not direct else (),
        hostnames=rule.hostnames,
        request_headers=rule.request_headers,
        response_headers=rule.response_headers,
        mirrors=tuple(mirrors),
        redirect=rule.redirect,
        rewrite=rule.rewrite,
        timeout=rule.timeout,
        backend_timeout=rule.backend_timeout,
        direct_status=direct,
        invalid_status=error,
        source=rule.source,
    )


def _reach(
    builder: Builder,
    service: MeshService | None,
    number: int,
    source: ServiceAccount,
    clusters: dict[str, ClusterRef],
) -> ClusterRef | None:
    """The cluster of a backend's port, if it resolved and the client may call it."""
    if service is None or not builder.may_call(source, service):
        return None
    known = builder.services.get(service)
    port = next((p for p in known.ports if p.port == number), None) if known else None
    if known is None or port is None:
        return None
    ref = builder.cluster_ref(known, port, source)
    clusters[ref.name] = ref
    return ref
