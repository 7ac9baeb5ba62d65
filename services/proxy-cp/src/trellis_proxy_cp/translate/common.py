"""Small builders every translator uses: Any packing, addresses, ADS config sources, TLS."""

from __future__ import annotations

import ipaddress

from envoy.config.core.v3 import address_pb2, base_pb2, config_source_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2, tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2
from google.protobuf.message import Message

from trellis_proxy_cp.translate import names

TLS_SOCKET = "envoy.transport_sockets.tls"


def pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def seconds(value: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(value * 1e9))
    return duration


def one_endpoint(cluster_name: str, address: str, port: int) -> endpoint_pb2.ClusterLoadAssignment:
    """A load assignment of one address (the local application, a collector)."""
    return endpoint_pb2.ClusterLoadAssignment(
        cluster_name=cluster_name,
        endpoints=[
            endpoint_components_pb2.LocalityLbEndpoints(
                lb_endpoints=[
                    endpoint_components_pb2.LbEndpoint(
                        endpoint=endpoint_components_pb2.Endpoint(
                            address=socket_address(address, port)
                        )
                    )
                ]
            )
        ],
    )


UNIX_PREFIX = "unix://"


def socket_address(address: str, port: int) -> address_pb2.Address:
    """An IP (or, for a DNS cluster, a host name) and port; a ``unix:///path`` endpoint (a
    ServiceEntry's) is the socket at that path on the proxy's own host, with no port."""
    if address.startswith(UNIX_PREFIX):
        return address_pb2.Address(pipe=address_pb2.Pipe(path=address.removeprefix(UNIX_PREFIX)))
    return address_pb2.Address(
        socket_address=address_pb2.SocketAddress(address=address, port_value=port)
    )


def ads() -> config_source_pb2.ConfigSource:
    """Every resource comes over the same ADS stream (Envoy 1.40: resource_api_version V3)."""
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.V3,
    )


def sds(name: str) -> secret_pb2.SdsSecretConfig:
    return secret_pb2.SdsSecretConfig(name=name, sds_config=ads())


def san_type(name: str) -> common_pb2.SubjectAltNameMatcher.SanType.ValueType:
    """The kind of SAN a ServiceEntry's ``subjectAltNames`` value names: a URI (a SPIFFE
    id), an IP address, else a DNS name (which a wildcard certificate name matches)."""
    if "://" in name:
        return common_pb2.SubjectAltNameMatcher.URI
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return common_pb2.SubjectAltNameMatcher.DNS
    return common_pb2.SubjectAltNameMatcher.IP_ADDRESS


def mesh_tls_context(
    spiffe_ids: tuple[str, ...] | list[str], subject_alt_names: tuple[str, ...] | list[str] = ()
) -> tls_pb2.CommonTlsContext:
    """Present the identity's certificate; verify peers against the mesh CA and, when
    given, their SPIFFE ids (URI SANs) or ``subject_alt_names`` (a ServiceEntry's): the
    peer's certificate must carry one of them."""
    matchers = [(common_pb2.SubjectAltNameMatcher.URI, spiffe) for spiffe in spiffe_ids]
    matchers += [(san_type(name), name) for name in subject_alt_names]
    default = common_pb2.CertificateValidationContext(
        match_typed_subject_alt_names=[
            common_pb2.SubjectAltNameMatcher(
                san_type=kind, matcher=string_pb2.StringMatcher(exact=value)
            )
            for kind, value in dict.fromkeys(matchers)
        ]
    )
    return tls_pb2.CommonTlsContext(
        tls_certificate_sds_secret_configs=[sds(names.SERVICE_CERT)],
        combined_validation_context=tls_pb2.CommonTlsContext.CombinedCertificateValidationContext(
            default_validation_context=default,
            validation_context_sds_secret_config=sds(names.MESH_CA),
        ),
    )


def upstream_tls(
    sni: str,
    spiffe_ids: tuple[str, ...] | list[str],
    subject_alt_names: tuple[str, ...] | list[str] = (),
) -> base_pb2.TransportSocket:
    context = tls_pb2.UpstreamTlsContext(
        sni=sni, common_tls_context=mesh_tls_context(spiffe_ids, subject_alt_names)
    )
    return base_pb2.TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def downstream_mtls(alpn: tuple[str, ...] = ("h2", "http/1.1")) -> base_pb2.TransportSocket:
    """Terminate mTLS: a client certificate from the mesh CA is required."""
    context = tls_pb2.DownstreamTlsContext(
        require_client_certificate=wrappers_pb2.BoolValue(value=True),
        common_tls_context=tls_pb2.CommonTlsContext(
            tls_certificate_sds_secret_configs=[sds(names.SERVICE_CERT)],
            validation_context_sds_secret_config=sds(names.MESH_CA),
            alpn_protocols=list(alpn),
        ),
    )
    return base_pb2.TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def normalized(manager: hcm.HttpConnectionManager) -> hcm.HttpConnectionManager:
    """Paths as the route and RBAC matchers should see them, on every connection manager:
    ``.`` and ``..`` resolved and percent-encoded unreserved characters decoded (RFC 3986,
    ``normalize_path``), ``//`` merged, and a request whose path has an escaped slash
    (``%2F``, ``%5C``) refused with 400. Otherwise ``GET /books/../admin`` would match a
    rule for ``/books/.*`` and reach ``/admin`` (Istio's CVE-2019-9901 and CVE-2021-31920)."""
    manager.normalize_path.value = True
    manager.merge_slashes = True
    manager.path_with_escaped_slashes_action = (
        hcm.HttpConnectionManager.PathWithEscapedSlashesAction.REJECT_REQUEST
    )
    return manager
