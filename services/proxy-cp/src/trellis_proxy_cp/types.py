"""Names every layer of proxy-cp shares: xDS type URLs and the resource names Trellis uses."""

from __future__ import annotations

from typing import NewType

TypeUrl = NewType("TypeUrl", str)

_PREFIX = "type.googleapis.com/"
LISTENER = TypeUrl(_PREFIX + "envoy.config.listener.v3.Listener")
ROUTE = TypeUrl(_PREFIX + "envoy.config.route.v3.RouteConfiguration")
CLUSTER = TypeUrl(_PREFIX + "envoy.config.cluster.v3.Cluster")
ENDPOINT = TypeUrl(_PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment")
SECRET = TypeUrl(_PREFIX + "envoy.extensions.transport_sockets.tls.v3.Secret")

# The order Envoy needs things in: clusters before their endpoints, listeners before routes.
ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET)
SHORT = {CLUSTER: "cds", ENDPOINT: "eds", LISTENER: "lds", ROUTE: "rds", SECRET: "sds"}
_KNOWN: dict[str, TypeUrl] = {url: url for url in ORDER}


def type_url(text: str) -> TypeUrl:
    """A request's type URL as the shared constant when it is one of ours: every request
    parses a fresh string, and a stream keeps the one it was last asked for per type
    (thousands of streams: kilobytes each)."""
    return _KNOWN.get(text) or TypeUrl(text)
