"""All of one proxy group's resources from a view: the translators put together."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import Message

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import (
    capture,
    clusters,
    endpoints,
    external,
    listeners,
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
) -> Resources:
    """The group's resources. Load assignments come from ``assignments``, which keeps
    them for reuse by later calls (the control plane passes its own); without it, a fresh
    one serves this call only, and nothing is kept."""
    if assignments is None:
        assignments = endpoints.LoadAssignments()
    found_secrets = (
        list(secrets.secrets(material, settings.workload_dir)) if material is not None else []
    )
    if settings.proxyless:
        listeners_, routes_, clusters_, endpoints_ = proxyless.resources(view, assignments)
        return Resources(listeners_, routes_, clusters_, endpoints_, found_secrets)
    if settings.capture:
        return _captured(view, settings, assignments, found_secrets)
    inbound_ports = clusters.inbound_ports(view, settings)
    found_listeners: list[Message] = [
        listeners.outbound(view, settings.outbound_address, settings.outbound_port)
    ]
    own = {settings.outbound_port, settings.inbound_port, settings.app_port}
    tcp = listeners.outbound_tcp(view, settings.outbound_address, set(own))
    found_listeners += external.outbound(view, settings.outbound_address, own, tcp)
    found_routes: list[Message] = [routes.outbound(view)]
    inbound = listeners.inbound(
        view, inbound_ports, settings.inbound_address, settings.inbound_port
    )
    if inbound is not None:
        found_listeners.append(inbound)
        if inbound_ports[0].protocol in routes.HTTP_PROTOCOLS:
            found_routes.append(routes.inbound(view, inbound_ports))
    return Resources(
        listeners=found_listeners,
        routes=found_routes,
        clusters=list(clusters.clusters(view, settings)),
        endpoints=list(assignments.of_view(view, settings.locality)),
        secrets=found_secrets,
    )


def _captured(
    view: catalog_pb2.View,
    settings: ProxySettings,
    assignments: endpoints.LoadAssignments,
    found_secrets: list[Message],
) -> Resources:
    """A sidecar whose pod redirects its traffic: listeners by original destination."""
    found_listeners: list[Message] = [capture.outbound(view, settings)]
    inbound = capture.inbound(view, settings)
    if inbound is not None:
        found_listeners.append(inbound)
    return Resources(
        listeners=found_listeners,
        routes=[routes.outbound(view), *capture.inbound_routes(view)],
        clusters=list(clusters.clusters(view, settings)),
        endpoints=list(assignments.of_view(view, settings.locality)),
        secrets=found_secrets,
    )
