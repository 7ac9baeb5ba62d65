"""Which resource types a change concerns, as the translators read their inputs.

Istio's pilot asks, per type, whether a push concerns it; this is the same question for
the two changes proxy-cp sees.

**A policy that changed** (:func:`kinds_concerned`) concerns the kinds whose translators
read a field of the ``View`` that differs, as :data:`READS` lists them for a sidecar
(captured or not): a TrafficSplit's new weights (``outbound``) rebuild listeners and
routes, and the group's clusters, load assignments and secrets stay the very objects they
were. A proxyless client or a gateway is rebuilt whole. ``test_core_kinds`` checks the
table against a whole build for every field of every fixture view.

**A slice whose endpoints moved** (its SPIFFE ids did not, :func:`endpoints_only`)
concerns a group's ClusterLoadAssignments only, unless something else the group's
translators make reads those endpoints:

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
from trellis_proxy_cp.translate.proxy import KINDS
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


#: Fields of a policy that say which policy it is, not what it holds: never compared.
UNREAD = frozenset(("version", "revision"))

#: The fields of the identity itself: every kind reads them (they do not change for one
#: identity, so this costs nothing).
_IDENTITY = frozenset(("identity", "namespace", "service", "service_account", "spiffe_id"))

#: The ``View`` fields each kind's translators read for a sidecar, captured or not (a
#: kind not listed reads every field). Secrets come from the certificate material alone;
#: load assignments from the clusters, their slices and the mesh's locality setting;
#: clusters from the clusters (mesh and inbound ones) and the egress routes; routes from
#: the destinations, ServiceEntries, egress routes and inbound ports. Listeners read all.
READS: dict[str, frozenset[str]] = {
    "secrets": _IDENTITY,
    "endpoints": _IDENTITY | {"clusters", "mesh"},
    "clusters": _IDENTITY | {"clusters", "inbound", "mesh", "egress"},
    "routes": _IDENTITY | {"outbound", "external", "egress", "inbound", "mesh"},
}


def changed_fields(before: catalog_pb2.View, after: catalog_pb2.View) -> frozenset[str]:
    """The fields of two policies of one identity that differ (:data:`UNREAD` aside)."""
    return frozenset(
        field.name
        for field in catalog_pb2.View.DESCRIPTOR.fields
        if field.name not in UNREAD and getattr(before, field.name) != getattr(after, field.name)
    )


def kinds_concerned(
    before: catalog_pb2.View, after: catalog_pb2.View, settings: ProxySettings
) -> frozenset[str]:
    """The kinds of resource (:data:`~.proxy.KINDS`) a group of ``settings`` must
    translate again when its identity's policy goes from ``before`` to ``after`` (with
    the same slices and certificate material): every kind for a proxyless client or a
    gateway."""
    if settings.proxyless or settings.gateway:
        return KINDS
    changed = changed_fields(before, after)
    return frozenset(
        kind for kind in KINDS if changed and (kind not in READS or changed & READS[kind])
    )
