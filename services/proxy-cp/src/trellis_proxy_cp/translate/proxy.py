"""All of one proxy group's resources from a view: the translators put together.

A sidecar gets its outbound and inbound listeners (or, capturing, those by original
destination); a proxyless client its API listeners; a Gateway's Envoy (``gateway`` in its
node metadata) the Gateway's listeners only, with the routes' backends as its clusters.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf.message import Message

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import (
    capture,
    clusters,
    endpoints,
    external,
    gateway_listeners,
    listeners,
    names,
    proxyless,
    routes,
    secrets,
)
from trellis_proxy_cp.translate.settings import ProxySettings


@dataclass(frozen=True, slots=True)
class Resources:
    listeners: list[Message]
    routes: list[Message]
    clusters: list[Message]
    endpoints: list[Message]
    secrets: list[Message]


def translate(
    view: catalog_pb2.View,
    settings: ProxySettings,
    material: secrets.SecretMaterial | None,
    assignments: endpoints.LoadAssignments | None = None,
    *,
    with_endpoints: bool = True,
    only: Collection[str] | None = None,
) -> Resources:
    """The group's resources. Load assignments come from ``assignments``, which keeps
    them for reuse by later calls; without it, a fresh one serves this call only, and
    nothing is kept. ``with_endpoints=False`` leaves them out (the control plane makes a
    sidecar's or gateway's itself, one per slice: :mod:`~trellis_proxy_cp.assignments`;
    a proxyless client's drop ``unix://`` endpoints, so they are made here).

    ``only`` (a sidecar's, captured or not): the kinds to translate, by :data:`KINDS`
    name; the others are left empty. A proxyless client or a gateway gets every kind."""
    if assignments is None:
        assignments = endpoints.LoadAssignments()
    if not with_endpoints:
        assignments = _NoAssignments()
    if settings.built_whole:
        only = None
    wanted = KINDS if only is None else frozenset(only)
    found_secrets = (
        list(secrets.secrets(material, settings.workload_dir))
        if material is not None and "secrets" in wanted
        else []
    )
    if settings.proxyless:
        listeners_, routes_, clusters_, endpoints_ = proxyless.resources(view, assignments)
        return Resources(listeners_, routes_, clusters_, endpoints_, found_secrets)
    if settings.gateway:
        return _gateway(view, settings, assignments, found_secrets)
    found_clusters = list(clusters.clusters(view, settings)) if "clusters" in wanted else []
    found_endpoints = (
        list(assignments.of_view(view, settings.locality)) if "endpoints" in wanted else []
    )
    if settings.capture:
        found_listeners, found_routes = _captured(view, settings, wanted)
    else:
        found_listeners, found_routes = _sidecar(view, settings, wanted)
    return Resources(found_listeners, found_routes, found_clusters, found_endpoints, found_secrets)


#: The kinds of resource :func:`translate` makes, by :class:`Resources` field.
KINDS = frozenset(("listeners", "routes", "clusters", "endpoints", "secrets"))


def _sidecar(
    view: catalog_pb2.View, settings: ProxySettings, wanted: Collection[str]
) -> tuple[list[Message], list[Message]]:
    """A sidecar's listeners and routes (those of ``wanted``): explicit ports."""
    found_listeners: list[Message] = []
    found_routes: list[Message] = []
    if "listeners" not in wanted and "routes" not in wanted:
        return found_listeners, found_routes
    inbound_ports = clusters.inbound_ports(view, settings)
    if "listeners" in wanted:
        found_listeners.append(
            listeners.outbound(view, settings.outbound_address, settings.outbound_port)
        )
        own = {settings.outbound_port, settings.inbound_port, settings.app_port}
        tcp = listeners.outbound_tcp(view, settings.outbound_address, set(own))
        found_listeners += external.outbound(view, settings.outbound_address, own, tcp)
    if "routes" in wanted:
        found_routes.append(routes.outbound(view))
    inbound = listeners.inbound(
        view, inbound_ports, settings.inbound_address, settings.inbound_port
    )
    if inbound is not None:
        if "listeners" in wanted:
            found_listeners.append(inbound)
        if "routes" in wanted and inbound_ports[0].protocol in routes.HTTP_PROTOCOLS:
            found_routes.append(routes.inbound(view, inbound_ports))
    return found_listeners, found_routes


class _NoAssignments(endpoints.LoadAssignments):
    """Load assignments left out: the caller makes them."""

    def of_view(
        self, view: catalog_pb2.View, locality: str = ""
    ) -> list[endpoint_pb2.ClusterLoadAssignment]:
        return []


def _captured(
    view: catalog_pb2.View, settings: ProxySettings, wanted: Collection[str]
) -> tuple[list[Message], list[Message]]:
    """A sidecar whose pod redirects its traffic (those of ``wanted``): listeners by
    original destination."""
    found_listeners: list[Message] = []
    if "listeners" in wanted:
        found_listeners.append(capture.outbound(view, settings))
        inbound = capture.inbound(view, settings)
        if inbound is not None:
            found_listeners.append(inbound)
    found_routes: list[Message] = (
        [routes.outbound(view), *capture.inbound_routes(view)] if "routes" in wanted else []
    )
    return found_listeners, found_routes


def _gateway(
    view: catalog_pb2.View,
    settings: ProxySettings,
    assignments: endpoints.LoadAssignments,
    found_secrets: list[Message],
) -> Resources:
    """A Gateway's Envoy: its ports' listeners and routes, the backends' mesh clusters (as
    a client: nothing inbound), its own certificate and the mesh CA, and the certificates
    its HTTPS listeners serve. No ports (the Gateway was deleted): no listeners."""
    served = gateway_listeners.resources(view, settings.gateway_certs_dir)
    inbound = {names.inbound_cluster(p.port) for p in clusters.inbound_ports(view, settings)}
    found_secrets = found_secrets + list(
        secrets.gateway_certificates(served.certificates, settings.gateway_certs_dir)
    )
    return Resources(
        listeners=list(served.listeners),
        routes=list(served.routes),
        clusters=[c for c in clusters.clusters(view, settings) if c.name not in inbound],
        endpoints=list(assignments.of_view(view, settings.locality)),
        secrets=found_secrets,
    )
