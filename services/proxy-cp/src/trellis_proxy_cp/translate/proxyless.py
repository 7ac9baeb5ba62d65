"""Resources for proxyless gRPC clients: grpcio's own xDS client instead of a sidecar.

A gRPC channel to ``xds:///NAME`` asks for the Listener named exactly NAME, then its route
configuration, clusters and load assignments, all by name (``../shared/notes``). For each
HTTP destination of the view (gRPC included), every name a client may dial (``hello``,
``hello.shop``, ..., each with and without the port) is a Listener holding an
``api_listener`` whose connection manager takes its routes over RDS; the route
configuration is the destination's routes, as a sidecar gets them (SMI splits, Gateway API
rules in precedence order, per-hostname virtual hosts), within what gRPC reads:

- ``path_separated_prefix`` (Gateway API prefixes) is not one of gRPC's path matchers: it
  becomes the regex ``<prefix>(/.*)?``, the same set of paths.
- gRPC has no direct responses (a route with one fails the call with UNAVAILABLE, "Matching
  route has inappropriate action"), but it has the fault injection filter (gRFC A33): a
  route that answers a status (no match, an ExtensionRef) routes to a cluster and aborts
  every call with the gRPC code a sidecar's client would see for that HTTP status
  (:data:`GRPC_CODES`, Envoy's own mapping): no match is UNIMPLEMENTED, as GEP-1016 wants.
  The connection manager carries the fault filter (no fault of its own), each such route
  its abort (``typed_per_filter_config``). An invalid backend's share stays UNAVAILABLE, as
  GEP-1016 wants: its cluster does not exist.
- Header modifiers, mirrors and rewrites are ignored by gRPC; a Gateway API ``timeout``
  becomes ``max_stream_duration``, which gRPC applies as the call's deadline.
- Clusters are the view's EDS clusters with mTLS from the bootstrap's certificate provider
  (``file_watcher``, instance :data:`CERTIFICATE_PROVIDER`): the workload's certificate,
  and the mesh CA with the destination's SPIFFE ids (and a MESH_INTERNAL ServiceEntry's
  ``subjectAltNames``) as the accepted SANs.
- gRPC's EDS takes socket addresses only (it refuses an assignment with a ``pipe``): a
  ServiceEntry's ``unix://`` endpoints are left out of its load assignments (the entry's
  status says so).

There is no inbound side: a proxyless server is a plain gRPC server serving mTLS with the
same files (its own workload certificate and key, which ``trellis grpc agent`` renews). No
key is in the snapshot: only the trust bundle, as an SDS secret.
"""

from __future__ import annotations

import re

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.http.fault.v3 import fault_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf.message import Message

from trellis_api import catalog_pb2
from trellis_common.grpc_bootstrap import CERTIFICATE_PROVIDER
from trellis_proxy_cp.translate import clusters, endpoints, routes
from trellis_proxy_cp.translate.common import TLS_SOCKET, UNIX_PREFIX, ads, pack, seconds
from trellis_proxy_cp.translate.gateway import INVALID_BACKEND
from trellis_proxy_cp.translate.listeners import ROUTER

FAULT_FILTER = "envoy.filters.http.fault"
#: An HTTP status as the gRPC code a client gets from Envoy's local reply of it
#: (``Grpc::Utility::httpToGrpcStatus``); any other status is UNKNOWN.
GRPC_CODES = {400: 13, 401: 16, 403: 7, 404: 12, 429: 14, 502: 14, 503: 14, 504: 14}
UNKNOWN = 2
_FAULT = hcm.HttpFilter(name=FAULT_FILTER, typed_config=pack(fault_pb2.HTTPFault()))


def route_config_name(service: catalog_pb2.OutboundService) -> str:
    return f"proxyless|{service.namespace}/{service.name}|{service.port}"


def _listener(name: str, route_config: str) -> listener_pb2.Listener:
    manager = hcm.HttpConnectionManager(
        stat_prefix=name,
        rds=hcm.Rds(config_source=ads(), route_config_name=route_config),
        http_filters=[_FAULT, ROUTER],
    )
    return listener_pb2.Listener(
        name=name, api_listener=api_listener_pb2.ApiListener(api_listener=pack(manager))
    )


def _abort(route: rc.Route, cluster: str) -> None:
    """A direct response as a route to ``cluster`` whose calls all fail with the gRPC code
    of the response's status (gRPC reads no direct response, but reads faults)."""
    code = GRPC_CODES.get(route.direct_response.status, UNKNOWN)
    route.ClearField("direct_response")
    route.route.CopyFrom(rc.RouteAction(cluster=cluster))
    fault = fault_pb2.HTTPFault(
        abort=fault_pb2.FaultAbort(
            grpc_status=code,
            percentage=percent_pb2.FractionalPercent(
                numerator=100, denominator=percent_pb2.FractionalPercent.HUNDRED
            ),
        )
    )
    route.typed_per_filter_config[FAULT_FILTER].CopyFrom(pack(fault))


def _for_grpc(route: rc.Route, source: catalog_pb2.Route | None, cluster: str) -> rc.Route:
    """What gRPC's xDS client reads of a route (the module docstring); ``cluster``: one the
    route may name when it aborts every call."""
    if route.HasField("direct_response"):
        _abort(route, cluster)
    match = route.match
    if match.HasField("path_separated_prefix"):
        prefix = match.path_separated_prefix
        match.safe_regex.CopyFrom(regex_pb2.RegexMatcher(regex=f"{re.escape(prefix)}(/.*)?"))
    if route.HasField("route"):
        action = route.route
        action.ClearField("retry_policy")  # gRPC's retries take gRPC codes, not OSM's
        if source is not None and source.HasField("timeout") and source.timeout > 0:
            action.max_stream_duration.max_stream_duration.CopyFrom(seconds(source.timeout))
    return route


def _hosts(service: catalog_pb2.OutboundService) -> list[rc.VirtualHost]:
    hosts = routes.service_hosts(service, list(service.hostnames))
    by_name = {r.name: r for r in service.routes}
    # an aborting route still names a cluster, which gRPC watches: one it watches anyway
    named = [c.cluster for r in service.routes for c in r.clusters if c.cluster and c.weight]
    cluster = named[0] if named else INVALID_BACKEND
    for host in hosts:
        for route in host.routes:
            _for_grpc(route, by_name.get(route.name), cluster)
    return hosts


def _tls(spiffe_ids: list[str]) -> base_pb2.TransportSocket:
    context = tls_pb2.UpstreamTlsContext(
        common_tls_context=tls_pb2.CommonTlsContext(
            tls_certificate_provider_instance=common_pb2.CertificateProviderPluginInstance(
                instance_name=CERTIFICATE_PROVIDER, certificate_name="default"
            ),
            validation_context=common_pb2.CertificateValidationContext(
                ca_certificate_provider_instance=common_pb2.CertificateProviderPluginInstance(
                    instance_name=CERTIFICATE_PROVIDER, certificate_name="default"
                ),
                match_subject_alt_names=[
                    string_pb2.StringMatcher(exact=spiffe) for spiffe in spiffe_ids
                ],
            ),
        )
    )
    return base_pb2.TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def _cluster(source: catalog_pb2.Cluster) -> cluster_pb2.Cluster:
    cluster = clusters.mesh_cluster(source)
    cluster.ClearField("typed_extension_protocol_options")  # gRPC speaks HTTP/2 anyway
    if source.mesh_tls:
        cluster.transport_socket.CopyFrom(
            _tls(list(dict.fromkeys([*source.spiffe_ids, *source.subject_alt_names])))
        )
    return cluster


def _assignment(
    source: catalog_pb2.Cluster, assignments: endpoints.LoadAssignments
) -> endpoint_pb2.ClusterLoadAssignment:
    """The cluster's load assignment, without its ``unix://`` endpoints (built apart, so
    the shared one of sidecars stays as it is)."""
    if not any(e.address.startswith(UNIX_PREFIX) for e in source.endpoints):
        return assignments(source)
    served = catalog_pb2.Cluster()
    served.CopyFrom(source)
    del served.endpoints[:]
    served.endpoints.extend(e for e in source.endpoints if not e.address.startswith(UNIX_PREFIX))
    return endpoints.LoadAssignments(kept_clusters=1)(served)


def resources(
    view: catalog_pb2.View, assignments: endpoints.LoadAssignments
) -> tuple[list[Message], list[Message], list[Message], list[Message]]:
    """Listeners, route configurations, clusters and load assignments for a proxyless
    client of ``view``'s identity; the load assignments are ``assignments``' (shared)."""
    found_listeners: list[Message] = []
    found_routes: list[Message] = []
    taken: set[str] = set()
    for service in view.outbound:
        if service.protocol not in routes.HTTP_PROTOCOLS or not service.routes:
            continue
        names = [n for n in service.hostnames if n not in taken]
        if not names:
            continue
        taken.update(names)
        config = route_config_name(service)
        found_listeners += [_listener(name, config) for name in names]
        found_routes.append(
            route_pb2.RouteConfiguration(name=config, virtual_hosts=_hosts(service))
        )
    eds = endpoints.eds_clusters(view)
    return (
        found_listeners,
        found_routes,
        [_cluster(c) for c in eds],
        [_assignment(c, assignments) for c in eds],
    )
