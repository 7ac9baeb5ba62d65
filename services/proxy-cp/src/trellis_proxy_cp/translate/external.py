"""ServiceEntry hosts on ports that are not HTTP: TLS, HTTPS, TCP and MONGO.

HTTP ports need nothing here: the Host header picks the entry on the outbound routes
(``routes.outbound``). Other traffic has no header, so the sidecar tells entries apart as
Istio's does:

- **TLS and HTTPS**: by the ClientHello's SNI (``server_names``, wildcards such as
  ``*.wikipedia.org`` as Envoy matches them; the ``tls_inspector`` listener filter reads
  it), then ``tcp_proxy`` to the entry's cluster for the port. The application's TLS
  passes through untouched: a MESH_EXTERNAL host terminates it, and the application
  checks that host's own certificate.
- **TCP and MONGO**: by the entry's ``addresses`` (destination CIDRs) where the
  connection's original destination is known (a pod whose traffic is captured,
  ``capture``), otherwise by the port alone; ``tcp_proxy`` to the cluster, behind Envoy's
  ``mongo_proxy`` filter for MONGO (statistics per Mongo operation; it reads the bytes and
  changes none).

Several entries on one port share one listener, one filter chain each; where two would
match the same connections the first (the catalog sorts by host) keeps the chain, since
Envoy refuses a listener with two chains of one match.

A VM sidecar (no traffic redirection) gets a listener per port on its outbound address,
as for mesh TCP services (``listeners.outbound_tcp``): the application connects to
``<outbound address>:<port>`` and names the host in SNI. A mesh TCP service on the same
port keeps that listener's port-only chain, and the entries' SNI chains join it. An entry
of ``resolution: NONE`` cannot use its cluster there: it sends a connection to the address
the application dialed, which on a VM is the sidecar itself. Its TLS hosts go instead to
the host the ClientHello names, on the entry's port (Envoy's SNI dynamic forward proxy and
a dynamic forward proxy cluster, ``sni-forward|<entry cluster>``, resolving as the egress
forward proxy does); its TCP ports, which name no host, are left out.
"""

from __future__ import annotations

from collections.abc import Iterable

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_components_pb2 as lc
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.mongo_proxy.v3 import mongo_proxy_pb2
from envoy.extensions.filters.network.sni_dynamic_forward_proxy.v3 import (
    sni_dynamic_forward_proxy_pb2 as sni_forward_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from google.protobuf import wrappers_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate import egress, ingress
from trellis_proxy_cp.translate.common import pack, socket_address
from trellis_proxy_cp.translate.routes import HTTP_PROTOCOLS

SNI_PROTOCOLS = frozenset({"tls", "https"})
MONGO = "mongo"
PASSTHROUGH = "PASSTHROUGH"  # the catalog's discovery for resolution NONE


def stat_prefix(external: catalog_pb2.ExternalService) -> str:
    """``tcp.<this>.*`` (and ``mongo.<this>.*``) in the sidecar's statistics."""
    return f"external_{external.host}_{external.port}"


def by_sni(external: catalog_pb2.ExternalService) -> bool:
    """The entry's connections are told apart by SNI: a TLS or HTTPS port of a named host
    (a bare ``*`` names no server: the port alone)."""
    return external.protocol in SNI_PROTOCOLS and external.host not in ("", "*")


def forward_cluster(external: catalog_pb2.ExternalService) -> str:
    """The dynamic forward proxy cluster of a VM sidecar's ``resolution: NONE`` TLS host."""
    return f"sni-forward|{external.cluster}"


def filters(external: catalog_pb2.ExternalService, forward: bool = False) -> list[lc.Filter]:
    """``tcp_proxy`` to the entry's cluster, with ``mongo_proxy`` first for MONGO; with
    ``forward``, to the host the SNI names (``forward_cluster``)."""
    prefix = stat_prefix(external)
    cluster = forward_cluster(external) if forward else external.cluster
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=prefix, cluster=cluster)
    found = [lc.Filter(name="envoy.filters.network.tcp_proxy", typed_config=pack(proxy))]
    if forward:
        config = sni_forward_pb2.FilterConfig(
            dns_cache_config=egress.dns_cache(), port_value=external.port
        )
        found.insert(
            0,
            lc.Filter(
                name="envoy.filters.network.sni_dynamic_forward_proxy", typed_config=pack(config)
            ),
        )
    if external.protocol == MONGO:
        mongo = mongo_proxy_pb2.MongoProxy(stat_prefix=prefix)
        found.insert(
            0, lc.Filter(name="envoy.filters.network.mongo_proxy", typed_config=pack(mongo))
        )
    return found


def sni_match(host: str, port: int | None = None) -> lc.FilterChainMatch:
    """A ClientHello naming ``host`` (on ``port``, where one listener takes many ports)."""
    match = lc.FilterChainMatch(server_names=[host], transport_protocol="tls")
    if port is not None:
        match.destination_port.CopyFrom(wrappers_pb2.UInt32Value(value=port))
    return match


def _forwarded(view: catalog_pb2.View) -> set[str]:
    """The clusters of ``resolution: NONE`` entries (the original destination's)."""
    return {c.name for c in view.clusters if c.discovery == PASSTHROUGH}


def _proxied(
    view: catalog_pb2.View, own: set[int]
) -> dict[int, list[tuple[catalog_pb2.ExternalService, bool]]]:
    """The entries a VM sidecar serves, by port, each with whether it goes to the host its
    SNI names: not HTTP, not on a port of the sidecar's own, and of ``resolution: NONE``
    only the TLS hosts."""
    forwarded = _forwarded(view)
    found: dict[int, list[tuple[catalog_pb2.ExternalService, bool]]] = {}
    for external in view.external:
        if external.protocol in HTTP_PROTOCOLS or external.port in own:
            continue
        forward = external.cluster in forwarded
        if forward and not by_sni(external):
            continue
        found.setdefault(external.port, []).append((external, forward))
    return found


def clusters(view: catalog_pb2.View) -> list[cluster_pb2.Cluster]:
    """A VM sidecar's dynamic forward proxy clusters, one per ``resolution: NONE`` cluster
    of a TLS host (the SNI filter sets the host; the cluster resolves and connects)."""
    forwarded = _forwarded(view)
    names = sorted(
        {forward_cluster(e) for e in view.external if e.cluster in forwarded and by_sni(e)}
    )
    return [egress.cluster(name) for name in names]


def _inspect(listener: listener_pb2.Listener) -> None:
    """Read the ClientHello for the SNI chains. A client that speaks first with something
    else is not held: past the inspector's timeout its connection goes on unmatched by SNI
    (a server-first protocol of a mesh service sharing the port)."""
    if not any(f.name == "envoy.filters.listener.tls_inspector" for f in listener.listener_filters):
        listener.listener_filters.append(ingress.tls_inspector())
        listener.MergeFrom(listener_pb2.Listener(continue_on_listener_filters_timeout=True))


def outbound(
    view: catalog_pb2.View, address: str, own: set[int], mesh: Iterable[listener_pb2.Listener]
) -> list[listener_pb2.Listener]:
    """A VM sidecar's port listeners: ``mesh`` (``listeners.outbound_tcp``'s) with the
    entries' chains added where they share a port, then one listener per other port."""
    found = list(mesh)
    by_port = {f.address.socket_address.port_value: f for f in found}
    for port, entries in sorted(_proxied(view, own).items()):
        listener = by_port.get(port)
        if listener is None:
            listener = listener_pb2.Listener(
                name=f"outbound-external|{port}", address=socket_address(address, port)
            )
            found.append(listener)
        seen = {
            c.filter_chain_match.SerializeToString(deterministic=True)
            for c in listener.filter_chains
        }
        for external, forward in entries:
            match = sni_match(external.host) if by_sni(external) else lc.FilterChainMatch()
            key = match.SerializeToString(deterministic=True)
            if key in seen:
                continue
            seen.add(key)
            chain = lc.FilterChain(
                name=f"external|{external.host}|{port}", filters=filters(external, forward)
            )
            if match.server_names:
                chain.filter_chain_match.CopyFrom(match)
                _inspect(listener)
            listener.filter_chains.append(chain)
    return found


__all__ = [
    "by_sni",
    "clusters",
    "filters",
    "forward_cluster",
    "outbound",
    "sni_match",
    "stat_prefix",
]
