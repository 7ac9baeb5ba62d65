"""Replicas of a component in a local run (``trellis up --replicas COMPONENT=N``, ``--ha``).

Locally, replicas of a component share its gRPC port (and the webhook, Destination and
enrollment ports): the servers bind them with SO_REUSEPORT, so the kernel spreads new
connections over the processes, as a Kubernetes Service spreads them over pods, and one
dying moves its clients to the others. Each replica has its own admin port and instance
name (``catalog-2``), which leader election and ``trellis status`` show.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from trellis_cli.supervisor import ProcessSpec, https_ready
from trellis_common import components

#: the components in ``trellis up``'s order: a replica's admin port follows its position
COMPONENT_ORDER = components.START_ORDER

REPLICA_ADMIN_BASE = 15070  # proxy-cp's: 15072..15086, clear of the services' and the demo's
#: the other components' replicas: 15300 + 20 * (position in SERVICES) + n, e.g. catalog-2 on
#: 15362, clear of the demo (14081..15163) and of proxy-cp's
OTHER_REPLICA_ADMIN_BASE = 15300
MAX_REPLICAS = 16
#: what ``--ha`` runs: two of every component (and Redis under Sentinel)
HA_REPLICAS = 2


def replica_admin_port(number: int, component: str = "proxy-cp") -> int:
    """The admin port of replica ``number`` (2..16) of ``component``: each has its own,
    while the gRPC port (and the webhook, Destination and enrollment ports) are shared."""
    if component == "proxy-cp":
        return REPLICA_ADMIN_BASE + number
    position = COMPONENT_ORDER.index(component)
    return OTHER_REPLICA_ADMIN_BASE + 20 * position + number


def admin_port_variable(component: str) -> str:
    """The setting that moves ``component``'s admin port (``TRELLIS_CATALOG_ADMIN_PORT``)."""
    return f"TRELLIS_{component.upper().replace('-', '_')}_ADMIN_PORT"


def replicas_of(spec: ProcessSpec, state_dir: Path, count: int) -> list[ProcessSpec]:
    """Replicas 2..count of the component ``spec`` (the first) runs: the same component (its
    identity, Redis user and join token), on the same gRPC port (and webhook, Destination
    and enrollment ports), which the servers bind with SO_REUSEPORT so that the kernel
    spreads new connections over them, as a Kubernetes Service spreads them over pods; one
    dying moves its clients to the others. Each announces itself as ``<component>-<n>``
    (its instance name: what leader election and ``trellis status`` show) and serves its
    admin API on a port of its own."""
    found: list[ProcessSpec] = []
    for number in range(2, count + 1):
        admin = replica_admin_port(number, spec.name)
        instance = f"{spec.name}-{number}"
        found.append(
            replace(
                spec,
                name=instance,
                ready=https_ready(f"https://127.0.0.1:{admin}/readyz", state_dir),
                ports=(admin,),  # the shared ports are the first one's
                env={
                    **spec.env,
                    "TRELLIS_INSTANCE": instance,
                    admin_port_variable(spec.name): str(admin),
                },
                address=f"{_shared(spec.address)}admin https://127.0.0.1:{admin}",
                # one after another: each trades the component's one join token file, which
                # the next one's start writes again
                after=(*spec.after, found[-1].name if found else spec.name),
            )
        )
    return found


def _shared(address: str) -> str:
    """The first replica's address with its admin part cut: the ports the others share."""
    shared = [part for part in address.split("  ") if part and not part.startswith("admin ")]
    return "".join(f"{part} (shared)  " for part in shared)


def parse_replicas(values: tuple[str, ...], proxy_cp: int = 1, ha: bool = False) -> dict[str, int]:
    """``--replicas COMPONENT=N`` (repeatable) with ``--proxy-cp-replicas`` and ``--ha``: how
    many processes of each component to run. ``ValueError`` names a bad value."""
    names = list(COMPONENT_ORDER)
    counts = dict.fromkeys(names, HA_REPLICAS if ha else 1)
    if proxy_cp > 1:
        counts["proxy-cp"] = proxy_cp
    for value in values:
        component, equals, number = value.partition("=")
        if not equals or component not in counts:
            raise ValueError(
                f"{value!r}: expected COMPONENT=N, COMPONENT one of {', '.join(names)}"
            )
        if not number.isdigit() or not 1 <= int(number) <= MAX_REPLICAS:
            raise ValueError(f"{value!r}: N must be a whole number from 1 to {MAX_REPLICAS}")
        counts[component] = int(number)
    return counts
