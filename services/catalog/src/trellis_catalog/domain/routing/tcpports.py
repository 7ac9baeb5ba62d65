"""TCP ports that several destinations of one client share.

A TCP client has no Host header: one outbound listener per port, one destination behind
it. :func:`shadow_tcp` marks, in one client's outbound list, the destinations that lose
their port to another; :func:`tcp_port_conflicts` finds the same conflicts mesh-wide, for
the Services' statuses. :func:`tcp_precedence` is the order both use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trellis_catalog.domain.index.services import KnownService
from trellis_catalog.domain.model.views import OutboundService
from trellis_common.model import MeshService
from trellis_spec.mesh import MeshSpec


def shadow_tcp(outbound: list[OutboundService], spec: MeshSpec) -> list[OutboundService]:
    """Mark the TCP destinations that lose their port to another one of the same client.

    A TCP client has no Host header: one listener per port, one destination behind it. The
    winner is a TrafficSplit root over any other service (its backends share its port by
    design), then the first by namespace/name; the others are marked ``shadowed_by`` it, so
    the conflict is explicit (``trellis policy check``, the Service's status) instead of
    depending on names."""
    by_port: dict[int, list[OutboundService]] = {}
    for service in outbound:
        if service.protocol == "tcp":
            by_port.setdefault(service.port, []).append(service)
    losers: dict[tuple[str, str, int], str] = {}
    for port, group in by_port.items():
        if len(group) < 2:
            continue
        winner = min(group, key=lambda o: tcp_precedence(o.namespace, o.name, spec))
        for service in group:
            if service is not winner:
                losers[service.namespace, service.name, port] = f"{winner.namespace}/{winner.name}"
    if not losers:
        return outbound
    return [
        replace(o, shadowed_by=losers[o.namespace, o.name, o.port])
        if (o.namespace, o.name, o.port) in losers and o.protocol == "tcp"
        else o
        for o in outbound
    ]


def tcp_port_conflicts(
    services: Mapping[MeshService, KnownService], spec: MeshSpec
) -> dict[MeshService, list[tuple[int, MeshService]]]:
    """Mesh-wide: each service with a TCP port that another service's port of the same
    number takes from clients that may reach both, with that port and the winner."""
    by_port: dict[int, list[MeshService]] = {}
    for service, known in services.items():
        if not known.external:
            for spec_port in known.ports:
                if spec_port.protocol == "tcp":
                    by_port.setdefault(spec_port.port, []).append(service)
    found: dict[MeshService, list[tuple[int, MeshService]]] = {}
    for number, group in sorted(by_port.items()):
        if len(group) > 1:
            winner = min(group, key=lambda s: tcp_precedence(s.namespace, s.name, spec))
            for service in group:
                if service != winner:
                    found.setdefault(service, []).append((number, winner))
    return found


def tcp_precedence(namespace: str, name: str, spec: MeshSpec) -> tuple[bool, str, str]:
    """Sorts first the service that takes a shared TCP port: a split root, then by name."""
    return (MeshService(namespace, name) not in spec.splits, namespace, name)
