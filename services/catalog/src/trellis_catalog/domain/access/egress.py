"""OSM ``Egress``: the calls out of the mesh one identity may make.

Egress (OSM's ``GetEgressTrafficMatches`` and ``buildHTTPRouteConfigs``) holds only while
MeshConfig ``traffic.enableEgress`` is off; with it on every host is reachable and Egress
policies have no effect. The policies whose sources include the identity's service account
are merged per (protocol, host, port): an ``http`` host allows the requests of the
policies' HTTPRouteGroups (all of them when a policy names none); ``tcp`` (and ``https``
without hosts) allows the policies' ``ipAddresses`` (any address when a policy names none).
A referenced HTTPRouteGroup that does not exist adds no match; a referenced
UpstreamTrafficSetting that does not exist makes OSM ignore the whole policy, and so does
Trellis.

The Egress documents' statuses need nothing but the spec, so they are the spec library's
(:func:`trellis_spec.egress.egress_statuses`). The other half of the mesh's edge, the calls
*into* it from outside (OSM ``IngressBackend``), is an inbound port's admission and lives
in :mod:`.inbound`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from trellis_catalog.domain.access.inbound import http_match
from trellis_catalog.domain.access.upstream import connection_settings
from trellis_catalog.domain.model.views import EgressRoute, HttpMatch
from trellis_common.documents import osm_access
from trellis_common.model import ServiceAccount
from trellis_spec.mesh import MeshSpec


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
