"""OSM Egress statuses that need no known service, so ``trellis spec validate`` checks them
offline as the catalog does: a missing UpstreamTrafficSetting or HTTPRouteGroup, Egress
with MeshConfig ``traffic.enableEgress`` on, and hosts a MESH_EXTERNAL ServiceEntry already
opens to every client."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from trellis_common.documents import istio
from trellis_spec.mesh import MeshSpec
from trellis_spec.statuses import Status


def warned(
    documents: Mapping[str, Status], key: str, problems: list[str], state: str = "warning"
) -> Status | None:
    """The document's status with ``problems`` as its reason and ``state`` (none when it
    has no problem, no status, or is already in error)."""
    status = documents.get(key)
    if status is None or not problems or status.state == "error":
        return None
    return replace(status, state=state, reason="; ".join(problems))


def _external_hosts(spec: MeshSpec) -> dict[tuple[str, int], str]:
    """(host, port) -> the MESH_EXTERNAL ServiceEntry that declares it."""
    found: dict[tuple[str, int], str] = {}
    for key, entry in spec.service_entries:
        if entry.location is istio.Location.MESH_EXTERNAL:
            for host in entry.hosts:
                for port in entry.ports:
                    found.setdefault((host, port.number), f"{key.namespace}/{key.name}")
    return found


def egress_statuses(spec: MeshSpec, documents: Mapping[str, Status]) -> dict[str, Status]:
    """The Egress statuses (and the UpstreamTrafficSettings they name): they need no known
    service, so ``trellis spec validate`` checks them offline too."""
    found: dict[str, Status] = {}
    external = _external_hosts(spec)
    for name, egress in spec.egresses:
        key = f"Egress {name}"
        namespace = name.partition("/")[0]
        problems = list(egress.ignored())
        state = "warning"
        setting_name = egress.traffic_setting()
        if setting_name is not None:
            if (namespace, setting_name) not in spec.traffic_settings:
                state = "error"
                problems.insert(
                    0,
                    f"UpstreamTrafficSetting {namespace}/{setting_name} (spec.matches) not "
                    "found: this Egress is ignored until it exists, as OSM does",
                )
            else:
                setting_key = f"UpstreamTrafficSetting {namespace}/{setting_name}"
                setting_status = documents.get(setting_key)
                if setting_status is not None and setting_status.state == "error":
                    # its host names no mesh service: it is an egress setting
                    found[setting_key] = replace(
                        setting_status,
                        state="valid",
                        reason=f"applies to the hosts of Egress {name}",
                    )
        missing = [g for g in egress.route_groups() if (namespace, g) not in spec.route_groups]
        if missing:
            problems.append(
                "HTTPRouteGroup(s) "
                + ", ".join(f"{namespace}/{g}" for g in missing)
                + " (spec.matches) not found: they allow no request until they exist"
            )
        if spec.egress:
            problems.append(
                "has no effect: MeshConfig traffic.enableEgress is on, so every host is reachable"
            )
        for port in egress.spec.ports:
            for host in egress.spec.hosts:
                entry = external.get((host, port.number))
                if entry is not None and port.protocol in ("http", "https"):
                    problems.append(
                        f"{host}:{port.number} is also ServiceEntry {entry}'s (MESH_EXTERNAL): "
                        "every client it is exported to reaches it, so this Egress does not "
                        "narrow it"
                    )
        status = warned(documents, key, problems, state)
        if status is not None:
            found[key] = status
    return found
