"""What one Envoy resource names in another: the edges a snapshot's consistency check follows.

Envoy warms a cluster until its ClusterLoadAssignment arrives, a listener until its
RouteConfiguration arrives, and either until the SDS secrets its TLS contexts name arrive.
A snapshot that leaves one of those edges dangling would leave proxies warming (and then
serving empty) for ``initial_fetch_timeout``, so :meth:`Snapshot.consistent` refuses it. These
functions read the edges out of the typed messages; they are pure and know no transport.

Only the places Trellis' translation uses are followed: a cluster's EDS config and its
transport sockets (also those of ``transport_socket_matches``); a listener's filter chains
(and default chain), their HttpConnectionManager's ``rds`` and their DownstreamTlsContext,
and an ``api_listener`` (proxyless gRPC) holding an HttpConnectionManager.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

_PREFIX = "type.googleapis.com/"
_HCM = _PREFIX + http_connection_manager_pb2.HttpConnectionManager.DESCRIPTOR.full_name
_UPSTREAM_TLS = _PREFIX + tls_pb2.UpstreamTlsContext.DESCRIPTOR.full_name
_DOWNSTREAM_TLS = _PREFIX + tls_pb2.DownstreamTlsContext.DESCRIPTOR.full_name


def eds_service_name(cluster: Any) -> str | None:
    """The ClusterLoadAssignment name an EDS cluster waits for; ``None`` if not EDS."""
    is_eds = cluster.HasField("eds_cluster_config") or (
        cluster.WhichOneof("cluster_discovery_type") == "type"
        and cluster.type == cluster_pb2.Cluster.EDS
    )
    if not is_eds:
        return None
    return str(cluster.eds_cluster_config.service_name or cluster.name)


def route_config_names(listener: Any) -> Iterator[str]:
    """RouteConfiguration names the listener's HttpConnectionManagers fetch over RDS."""
    for hcm in _connection_managers(listener):
        if hcm.HasField("rds") and hcm.rds.route_config_name:
            yield str(hcm.rds.route_config_name)


def cluster_secret_names(cluster: Any) -> Iterator[str]:
    """SDS secret names named by the cluster's UpstreamTlsContexts."""
    sockets = [cluster.transport_socket] if cluster.HasField("transport_socket") else []
    sockets += [m.transport_socket for m in cluster.transport_socket_matches]
    for socket in sockets:
        if socket.HasField("typed_config") and socket.typed_config.type_url == _UPSTREAM_TLS:
            context = tls_pb2.UpstreamTlsContext()
            socket.typed_config.Unpack(context)
            yield from _common_tls_secret_names(context.common_tls_context)


def listener_secret_names(listener: Any) -> Iterator[str]:
    """SDS secret names named by the DownstreamTlsContexts of the listener's filter chains."""
    for chain in _filter_chains(listener):
        socket = chain.transport_socket
        if socket.HasField("typed_config") and socket.typed_config.type_url == _DOWNSTREAM_TLS:
            context = tls_pb2.DownstreamTlsContext()
            socket.typed_config.Unpack(context)
            yield from _common_tls_secret_names(context.common_tls_context)


def _filter_chains(listener: Any) -> Iterator[Any]:
    yield from listener.filter_chains
    if listener.HasField("default_filter_chain"):
        yield listener.default_filter_chain


def _connection_managers(listener: Any) -> Iterator[Any]:
    configs = [
        f.typed_config
        for chain in _filter_chains(listener)
        for f in chain.filters
        if f.HasField("typed_config")
    ]
    if listener.HasField("api_listener"):
        configs.append(listener.api_listener.api_listener)
    for config in configs:
        if config.type_url == _HCM:
            hcm = http_connection_manager_pb2.HttpConnectionManager()
            config.Unpack(hcm)
            yield hcm


def _common_tls_secret_names(common: Any) -> Iterator[str]:
    for config in common.tls_certificate_sds_secret_configs:
        if config.name:
            yield str(config.name)
    kind = common.WhichOneof("validation_context_type")
    if kind == "validation_context_sds_secret_config":
        if common.validation_context_sds_secret_config.name:
            yield str(common.validation_context_sds_secret_config.name)
    elif kind == "combined_validation_context":
        name = common.combined_validation_context.validation_context_sds_secret_config.name
        if name:
            yield str(name)
