"""Small valid Envoy resources and snapshots: the edges the consistency check follows
(an EDS cluster over ADS and its load assignment, a listener fetching its routes over RDS, SDS
secrets named by TLS contexts), and nothing more."""

from __future__ import annotations

from typing import Any

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from trellis_proxy_cp.cache.snapshot import Resource, Snapshot, make_resource
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.types import TypeUrl

_PREFIX = "type.googleapis.com/"

#: The SDS names a proxy may ask for (proxy-cp refuses any other: limits.check_secrets).
CERT, CA = names.SERVICE_CERT, names.MESH_CA


def _ads() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def _packed(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _sds(name: str) -> secret_pb2.SdsSecretConfig:
    return secret_pb2.SdsSecretConfig(name=name, sds_config=_ads())


def _common_tls(cert: str, ca: str | None) -> tls_pb2.CommonTlsContext:
    common = tls_pb2.CommonTlsContext(tls_certificate_sds_secret_configs=[_sds(cert)])
    if ca is not None:
        common.validation_context_sds_secret_config.CopyFrom(_sds(ca))
    return common


def cluster(
    name: str, *, service_name: str = "", cert: str | None = None, ca: str | None = None
) -> cluster_pb2.Cluster:
    """An EDS cluster over ADS; with ``cert``, an UpstreamTlsContext naming SDS secrets."""
    built = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.EDS,
        eds_cluster_config=cluster_pb2.Cluster.EdsClusterConfig(
            eds_config=_ads(), service_name=service_name
        ),
    )
    built.connect_timeout.FromMilliseconds(250)
    if cert is not None:
        context = tls_pb2.UpstreamTlsContext(common_tls_context=_common_tls(cert, ca))
        built.transport_socket.name = "envoy.transport_sockets.tls"
        built.transport_socket.typed_config.CopyFrom(_packed(context))
    return built


def load_assignment(
    name: str, *ports: int, host: str = "127.0.0.1"
) -> endpoint_pb2.ClusterLoadAssignment:
    """A ClusterLoadAssignment with one weighted locality of ``host:port`` endpoints."""
    endpoints = [
        endpoint_components_pb2.LbEndpoint(
            endpoint=endpoint_components_pb2.Endpoint(
                address=address_pb2.Address(
                    socket_address=address_pb2.SocketAddress(address=host, port_value=port)
                )
            )
        )
        for port in ports
    ]
    locality = endpoint_components_pb2.LocalityLbEndpoints(lb_endpoints=endpoints)
    locality.load_balancing_weight.value = 1
    return endpoint_pb2.ClusterLoadAssignment(cluster_name=name, endpoints=[locality])


def _connection_manager(route_config: str) -> hcm_pb2.HttpConnectionManager:
    return hcm_pb2.HttpConnectionManager(
        stat_prefix="ingress",
        rds=hcm_pb2.Rds(config_source=_ads(), route_config_name=route_config),
        http_filters=[
            hcm_pb2.HttpFilter(
                name="envoy.filters.http.router", typed_config=_packed(router_pb2.Router())
            )
        ],
    )


def listener(
    name: str, route_config: str, *, port: int = 15001, cert: str | None = None
) -> listener_pb2.Listener:
    """A listener whose HttpConnectionManager fetches ``route_config`` over RDS."""
    chain = listener_components_pb2.FilterChain(
        filters=[
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager",
                typed_config=_packed(_connection_manager(route_config)),
            )
        ]
    )
    if cert is not None:
        context = tls_pb2.DownstreamTlsContext(common_tls_context=_common_tls(cert, None))
        chain.transport_socket.name = "envoy.transport_sockets.tls"
        chain.transport_socket.typed_config.CopyFrom(_packed(context))
    return listener_pb2.Listener(
        name=name,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(address="0.0.0.0", port_value=port)
        ),
        filter_chains=[chain],
    )


def api_listener(name: str, route_config: str) -> listener_pb2.Listener:
    """A proxyless gRPC listener: an ``api_listener`` holding the HttpConnectionManager."""
    return listener_pb2.Listener(
        name=name,
        api_listener=api_listener_pb2.ApiListener(
            api_listener=_packed(_connection_manager(route_config))
        ),
    )


def route_config(name: str, cluster_name: str, *, domains: tuple[str, ...] = ("*",)) -> Any:
    """A RouteConfiguration sending every request to ``cluster_name``."""
    return route_pb2.RouteConfiguration(
        name=name,
        virtual_hosts=[
            route_components_pb2.VirtualHost(
                name=name,
                domains=list(domains),
                routes=[
                    route_components_pb2.Route(
                        match=route_components_pb2.RouteMatch(prefix="/"),
                        route=route_components_pb2.RouteAction(cluster=cluster_name),
                    )
                ],
            )
        ],
    )


def secret(name: str, pem: bytes = b"-----BEGIN CERTIFICATE-----\n") -> secret_pb2.Secret:
    """A TLS certificate Secret (contents are not validated here)."""
    return secret_pb2.Secret(
        name=name,
        tls_certificate=common_pb2.TlsCertificate(
            certificate_chain=base_pb2.DataSource(inline_bytes=pem),
            private_key=base_pb2.DataSource(inline_bytes=b"key"),
        ),
    )


def resource(message: Message) -> Resource:
    """:func:`make_resource` with the type URL taken from the message."""
    return make_resource(TypeUrl(_PREFIX + message.DESCRIPTOR.full_name), message)


def snapshot(version: str, *items: Message | Resource) -> Snapshot:
    """A snapshot of messages (made into resources) and ready resources."""
    return Snapshot.of(version, [i if isinstance(i, Resource) else resource(i) for i in items])


def mesh(version: str, *, ports: tuple[int, ...] = (8080,), clusters: int = 2) -> Snapshot:
    """A consistent snapshot: clusters c0..cN (EDS, mTLS) with endpoints, listener l0 with
    route r0, secrets ``cert`` and ``ca``."""
    items: list[Message] = []
    for i in range(clusters):
        items += [cluster(f"c{i}", cert=CERT, ca=CA), load_assignment(f"c{i}", *ports)]
    items += [listener("l0", "r0", cert=CERT), route_config("r0", "c0")]
    items += [secret(CERT), secret(CA)]
    return snapshot(version, *items)
