"""Which resource types a change concerns, as the translators read their inputs.

Istio's pilot asks, per type, whether a push concerns it; this is the same question for
the two changes proxy-cp sees.

**A policy that changed** (:func:`kinds_concerned`) concerns the kinds whose translators
read a field of the ``View`` that differs, as :data:`READS` lists them for a sidecar
(captured or not): a TrafficSplit's new weights or an HTTPRouteGroup's new match (the
routes of an HTTP destination, :data:`HTTP_ROUTES`) rebuild the routes alone, and the
group's listeners, clusters, load assignments and secrets stay the very objects they
were. A proxyless client or a gateway is rebuilt whole. ``test_core_kinds`` checks the
table against a whole build for every field of every fixture view, and for each kind of
route change on each of their destinations.

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
from trellis_proxy_cp.translate.routes import HTTP_PROTOCOLS
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

#: Not a field: the part of ``outbound`` only the routes read, the routes (matches,
#: weights) and retry policies of HTTP destinations. When nothing else of ``outbound``
#: moved, :func:`changed_fields` names this in its place.
HTTP_ROUTES = "outbound.http_routes"

_FIELDS = frozenset(f.name for f in catalog_pb2.View.DESCRIPTOR.fields) - UNREAD

#: The ``View`` fields each kind's translators read for a sidecar, captured or not.
#: Listeners read every field, but of an HTTP destination's routes only whether there are
#: any and which clusters they name (:func:`_listened`); secrets read none (they come from
#: the certificate material alone); load assignments the clusters, their slices and the
#: mesh's locality setting; clusters the clusters (mesh and inbound ones) and the egress
#: routes; routes the destinations, ServiceEntries, egress routes and inbound ports.
READS: dict[str, frozenset[str]] = {
    "listeners": _FIELDS,
    "secrets": _IDENTITY,
    "endpoints": _IDENTITY | {"clusters", "mesh"},
    "clusters": _IDENTITY | {"clusters", "inbound", "mesh", "egress"},
    "routes": _IDENTITY | {"outbound", HTTP_ROUTES, "external", "egress", "inbound", "mesh"},
}


def _listened(service: catalog_pb2.OutboundService) -> tuple[object, ...]:
    """What the listeners read of a destination: all of a TCP one (its routes pick its
    clusters); of an HTTP one all but its routes and retry policy, and of those only
    whether there are any and the clusters they name (a captured pod matches a
    destination without addresses of its own on those clusters' endpoints)."""
    if service.protocol not in HTTP_PROTOCOLS:
        return (service.SerializeToString(deterministic=True),)
    shape = catalog_pb2.OutboundService()
    shape.CopyFrom(service)
    shape.ClearField("routes")
    shape.ClearField("retry")
    named = sorted({w.cluster for route in service.routes for w in route.clusters})
    return (shape.SerializeToString(deterministic=True), bool(service.routes), named)


def changed_fields(before: catalog_pb2.View, after: catalog_pb2.View) -> frozenset[str]:
    """The fields of two policies of one identity that differ (:data:`UNREAD` aside);
    :data:`HTTP_ROUTES` in place of ``outbound`` when only that part of it moved."""
    changed = {name for name in _FIELDS if getattr(before, name) != getattr(after, name)}
    if (
        "outbound" in changed
        and len(before.outbound) == len(after.outbound)
        and all(
            a == b or _listened(a) == _listened(b)
            for a, b in zip(before.outbound, after.outbound, strict=True)
        )
    ):
        changed = changed - {"outbound"} | {HTTP_ROUTES}
    return frozenset(changed)


def kinds_concerned(
    before: catalog_pb2.View, after: catalog_pb2.View, settings: ProxySettings
) -> frozenset[str]:
    """The kinds of resource (:data:`~.proxy.KINDS`) a group of ``settings`` must
    translate again when its identity's policy goes from ``before`` to ``after`` (with
    the same slices and certificate material): every kind for a proxyless client or a
    gateway."""
    if settings.built_whole:
        return KINDS
    changed = changed_fields(before, after)
    return frozenset(kind for kind in KINDS if changed & READS[kind])
