"""Which resource types a change concerns, as the translators read their inputs.

Istio's pilot asks, per type, whether a push concerns it; this is the same question for
the change proxy-cp sees most: a slice whose endpoints moved (its SPIFFE ids did not).
Such a change concerns a group's ClusterLoadAssignments only, unless something else the
group's translators make reads those endpoints:

* a cluster Envoy resolves itself (DNS, LOGICAL_DNS) or by original destination
  (PASSTHROUGH) carries its endpoints in CDS (``clusters.py``), not EDS;
* a capturing sidecar's outbound listener matches the addresses of the endpoints of
  services without addresses of their own (``capture.endpoint_addressed``);
* a proxyless client's assignments leave ``unix://`` endpoints out (``proxyless.py``),
  so it is rebuilt whole.
"""

from __future__ import annotations

from collections.abc import Collection

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import capture
from trellis_proxy_cp.translate.endpoints import is_eds
from trellis_proxy_cp.translate.settings import ProxySettings


def endpoints_only(
    policy: catalog_pb2.View, settings: ProxySettings, slices: Collection[str]
) -> bool:
    """Whether new endpoints in ``slices`` (by name) change only the group's load
    assignments, for a group of ``settings`` whose identity has ``policy``."""
    if settings.proxyless:
        return False
    clusters = [c for c in policy.clusters if c.slice in slices]
    if not all(is_eds(c) for c in clusters):
        return False
    if settings.capture:
        addressed = capture.endpoint_addressed(policy)
        return not any(c.name in addressed for c in clusters)
    return True
