"""Locality failover: EDS priorities relative to the proxy's own locality.

A proxy that says where it runs (``node.locality`` in its bootstrap) prefers the endpoints
nearest to it and fails over outward, by Istio's rule (its ``localityLbSetting``
without explicit ``failover`` entries): each locality of a cluster's endpoints gets a
priority from how much of it matches the proxy's ``region/zone/subzone``:

====================================  ========
the endpoints' locality               priority
====================================  ========
same region, zone and subzone         0
same region and zone                  1
same region                           2
anywhere else (or no locality)        3
====================================  ========

Envoy sends a priority's traffic to the next one as its healthy share drops (with its
overprovisioning factor 1.4: a priority keeps all of it until under about 71% of its hosts
are healthy), and only then; so the priorities used are made contiguous from 0 (Envoy's
priorities "should range from 0 to N without skipping", and Istio compacts them too).

When it applies: where MeshConfig turns it on (``spec.traffic.enableLocalityFailover``,
off by default: each proxy's traffic then stays in its own zone while that zone is
healthy, a change an operator makes on purpose), and there (``endpoints.fails_over``)
only on an EDS cluster with outlier detection (an OSM UpstreamTrafficSetting's
``outlierDetection``). Without a health signal every endpoint always counts as healthy,
and a proxy would send everything to its own locality even while it fails; Istio turns
failover on under the same condition. A proxy with no locality, and a cluster without
outlier detection, get one priority as before.

Localities are texts ``region[/zone[/subzone]]``, as endpoints carry them (VM
registrations, WorkloadEntries, ServiceEntry endpoints); parts are compared one by one, so
``eu/a`` and ``eu/a/`` are the same place.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from trellis_proxy_cp.translate.settings import InvalidNodeMetadata

#: (region, zone, subzone), empty where not given
Parts = tuple[str, str, str]

#: the priority of an endpoint locality that shares nothing with the proxy's
ELSEWHERE = 3


class NodeLocality(Protocol):
    """Envoy's ``config.core.v3.Locality`` (the node's), as far as it is read here."""

    region: str
    zone: str
    sub_zone: str


def parts(text: str) -> Parts:
    """``(region, zone, subzone)`` of a locality text; deeper parts join the subzone."""
    region, _, rest = text.partition("/")
    zone, _, sub_zone = rest.partition("/")
    return region, zone, sub_zone


def of_node(locality: NodeLocality) -> str:
    """The locality text of an Envoy node's ``locality`` ("" when it has none).

    A part holding ``/`` would make two different places one text (``a/b``+``c`` and
    ``a``+``b/c``), so it is refused, naming the field."""
    found = (locality.region, locality.zone, locality.sub_zone)
    for name, value in zip(("region", "zone", "sub_zone"), found, strict=True):
        if "/" in value:
            raise InvalidNodeMetadata(f"node.locality.{name}: {value!r} must not contain '/'")
    return "/".join(found).rstrip("/")


def priority(proxy: Parts, endpoint: Parts) -> int:
    """Istio's priority of ``endpoint``'s locality for a proxy at ``proxy`` (0: nearest)."""
    if proxy[0] != endpoint[0]:
        return ELSEWHERE
    if proxy[1] != endpoint[1]:
        return 2
    if proxy[2] != endpoint[2]:
        return 1
    return 0


def priorities(proxy: str, localities: Iterable[str]) -> dict[str, int]:
    """Each endpoint locality's priority for a proxy at ``proxy``, made contiguous from 0:
    a proxy in ``eu/a`` with endpoints only in ``eu/b`` and ``us/c`` gets them at 0 and 1,
    not 2 and 3 (Envoy would see two empty priorities first)."""
    own = parts(proxy)
    raw = {text: priority(own, parts(text)) for text in localities}
    rank = {level: index for index, level in enumerate(sorted(set(raw.values())))}
    return {text: rank[level] for text, level in raw.items()}
