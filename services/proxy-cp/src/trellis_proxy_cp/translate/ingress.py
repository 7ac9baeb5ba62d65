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
"""

from __future__ import annotations

import ipaddress

from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2
from envoy.config.rbac.v3 import rbac_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.listener.tls_inspector.v3 import tls_inspector_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import names
from trellis_proxy_cp.translate.common import pack


def plaintext(port: catalog_pb2.InboundPort) -> bool:
    return port.HasField("ingress") and port.ingress.protocol == "http"


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


def filter_chain(
    port: catalog_pb2.InboundPort, router: hcm.HttpFilter
) -> listener_components_pb2.FilterChain:
    """The plaintext chain of an ``http`` IngressBackend: its sources, to the application."""
    rule = port.ingress
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
    manager = hcm.HttpConnectionManager(
        stat_prefix="ingress",
        codec_type=hcm.HttpConnectionManager.AUTO,
        route_config=routes,
        http_filters=[router],  # forward_client_cert_details: SANITIZE, the default
    )
    return listener_components_pb2.FilterChain(
        name=f"ingress|{rule.policy}",
        filter_chain_match=listener_components_pb2.FilterChainMatch(
            transport_protocol="raw_buffer",
            source_prefix_ranges=[_cidr(r) for r in rule.source_ranges],
        ),
        filters=[
            listener_components_pb2.Filter(
                name="envoy.filters.network.http_connection_manager", typed_config=pack(manager)
            )
        ],
    )


def _any(ids: list[rbac_pb2.Principal]) -> rbac_pb2.Principal:
    if len(ids) == 1:
        return ids[0]
    return rbac_pb2.Principal(or_ids=rbac_pb2.Principal.Set(ids=ids))


def rbac_policy(port: catalog_pb2.InboundPort) -> rbac_pb2.Policy | None:
    """The RBAC policy of an ``https`` IngressBackend (None: it admits no one)."""
    if not port.HasField("ingress") or port.ingress.protocol != "https":
        return None
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
