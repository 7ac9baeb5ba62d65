"""OSM IngressBackend: traffic from outside the mesh to a service's inbound port.

- ``http``: plaintext, admitted by address. The inbound listener gets a TLS inspector and a
  second filter chain ahead of the mesh's, matching plaintext (``raw_buffer``) from the
  source ranges, as OSM's ingress filter chain does. It routes every request to the local
  application; the ``x-forwarded-client-cert`` a client sends is dropped. Plaintext from any
  other address matches no chain and is closed, as before the policy; so is everything once
  the policy is deleted.
- ``https``: mTLS, admitted by certificate. The client's certificate must come from the
  mesh CA (the mesh's chain verifies it, as OSM's ingress gateway certificate does) and
  name one of the policy's principals; an RBAC policy on the port says so, together with
  the source ranges and TLS server names when there are any (:func:`rbac_policy`).
- ``https`` with ``tls.skipClientCertValidation``: TLS from the source ranges (or for the
  TLS server names) with any client certificate, unverified: a chain of its own like the
  plaintext one, whose TLS context asks for no client certificate. OSM tells such clients
  from the mesh's by ALPN; here the source ranges or server names do, and without either
  the catalog does not set it (the policy's status says so).
"""

from __future__ import annotations

import ipaddress

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.common import TLS_SOCKET, normalized, pack, sds


def chained(port: catalog_pb2.InboundPort) -> bool:
    """The port's IngressBackend needs a filter chain of its own (plaintext, or TLS without
    client certificate validation)."""
    if not port.HasField("ingress"):
        return False
    return port.ingress.protocol == "http" or port.ingress.skip_client_cert_validation


def _cidr(text: str) -> address_pb2.CidrRange:
    network = ipaddress.ip_network(text, strict=False)
    return address_pb2.CidrRange(
        address_prefix=str(network.network_address),
        prefix_len=wrappers_pb2.UInt32Value(value=network.prefixlen),
    )


def tls_inspector() -> listener_components_pb2.ListenerFilter:
    return listener_components_pb2.ListenerFilter(
        name="envoy.filters.listener.tls_inspector",
        typed_config=pack(tls_inspector_pb2.TlsInspector()),
    )


def _server_tls() -> base_pb2.TransportSocket:
    """TLS with the identity's certificate, asking for no client certificate."""
    context = tls_pb2.DownstreamTlsContext(
        require_client_certificate=wrappers_pb2.BoolValue(value=False),
        common_tls_context=tls_pb2.CommonTlsContext(
            tls_certificate_sds_secret_configs=[sds(names.SERVICE_CERT)],
            alpn_protocols=["h2", "http/1.1"],
        ),
    )
    return base_pb2.TransportSocket(name=TLS_SOCKET, typed_config=pack(context))


def filter_chain(
    port: catalog_pb2.InboundPort, router: hcm.HttpFilter
) -> listener_components_pb2.FilterChain:
    """The chain of an IngressBackend that is not mTLS: its sources, to the application."""
    rule = port.ingress
    tls = rule.protocol == "https"
    routes = route_pb2.RouteConfiguration(
        name=f"ingress|{port.port}",
        virtual_hosts=[
            rc.VirtualHost(
                name=f"ingress|{port.port}",
                domains=["*"],
                routes=[
                    rc.Route(
                        name=f"ingress|{port.port}",
                        match=rc.RouteMatch(prefix="/"),
                        route=rc.RouteAction(cluster=names.inbound_cluster(port.port)),
                    )
                ],
            )
        ],
    )
    manager = normalized(
        hcm.HttpConnectionManager(
            stat_prefix="ingress",
            codec_type=hcm.HttpConnectionManager.AUTO,
            route_config=routes,
            http_filters=[router],  # forward_client_cert_details: SANITIZE, the default
        )
    )
    chain = listener_components_pb2.FilterChain(
        name=f"ingress|{rule.policy}",
        filter_chain_match=listener_components_pb2.FilterChainMatch(
            transport_protocol="tls" if tls else "raw_buffer",
            source_prefix_ranges=[_cidr(r) for r in rule.source_ranges],
            server_names=list(rule.sni_hosts) if tls else [],
        ),
        filters=[
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager", typed_config=pack(manager)
            )
        ],
    )
    if tls:
        chain.transport_socket.CopyFrom(_server_tls())
    return chain


def _any(ids: list[rbac_pb2.Principal]) -> rbac_pb2.Principal:
    if len(ids) == 1:
        return ids[0]
    return rbac_pb2.Principal(or_ids=rbac_pb2.Principal.Set(ids=ids))


def rbac_policy(port: catalog_pb2.InboundPort) -> rbac_pb2.Policy | None:
    """The RBAC policy of an ``https`` IngressBackend (None: it admits no one)."""
    if not port.HasField("ingress") or port.ingress.protocol != "https":
        return None
    if port.ingress.skip_client_cert_validation:
        return None  # its own chain admits it
    rule = port.ingress
    if not rule.principals:
        return None
    principal = _any(
        [
            rbac_pb2.Principal(
                authenticated=rbac_pb2.Principal.Authenticated(
                    principal_name=string_pb2.StringMatcher(exact=name)
                )
            )
            for name in rule.principals
        ]
    )
    if rule.source_ranges:
        ranges = _any([rbac_pb2.Principal(direct_remote_ip=_cidr(r)) for r in rule.source_ranges])
        principal = rbac_pb2.Principal(and_ids=rbac_pb2.Principal.Set(ids=[principal, ranges]))
    permission = rbac_pb2.Permission(any=True)
    if rule.sni_hosts:
        permission = rbac_pb2.Permission(
            or_rules=rbac_pb2.Permission.Set(
                rules=[
                    rbac_pb2.Permission(requested_server_name=string_pb2.StringMatcher(exact=host))
                    for host in rule.sni_hosts
                ]
            )
        )
    return rbac_pb2.Policy(permissions=[permission], principals=[principal])
