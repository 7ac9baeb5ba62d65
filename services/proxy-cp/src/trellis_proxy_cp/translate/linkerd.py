"""The catalog's destinations as the Linkerd Destination API says them (pure).

What a ``GetDestination.path`` names (:func:`parse_authority`), and the messages of
``io.linkerd.proxy.destination`` (linkerd2-proxy-api v0.18.0) and of the conduit-era
``conduit.proxy.destination`` built from a catalog ``Destination``: addresses with their
weight, metric labels, TLS identity, protocol hint and resource reference, and the profile
(routes, retry budget, TrafficSplit overrides). ``docs/linkerd.md`` says how each field is
chosen.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf import duration_pb2

from trellis_api import catalog_pb2 as cpb
from trellis_api.conduit.common import common_pb2 as conduit_common
from trellis_api.conduit.proxy.destination import destination_pb2 as conduit
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import http_types_pb2, meta_pb2, net_pb2
from trellis_common import ids

__all__ = [
    "Authority",
    "InvalidAuthority",
    "RetryBudget",
    "endpoint_key",
    "parse_authority",
]

#: Linkerd's weight of one endpoint (``endpoint_translator.go``); ours multiply it.
ENDPOINT_WEIGHT = 10_000
#: Split weights are decimillis: the overrides of one profile sum to this.
SPLIT_TOTAL = 10_000
DEFAULT_PORT = 80
_METHODS = {name: value for value, name in enumerate(http_types_pb2.HttpMethod.Registered.keys())}


class InvalidAuthority(ValueError):
    """A ``GetDestination.path`` that names nothing: the reason is the message."""


@dataclass(frozen=True, slots=True)
class Authority:
    """What a path names, and a port: an IP address, or a host name (``host``, which a
    ServiceEntry may own), which is also a service (``namespace``, ``service``) when it is
    ``<service>.<namespace>.svc.<cluster-domain>``, or one instance of it (``instance``)
    when it is ``<instance>.<service>.<namespace>.svc.<cluster-domain>``."""

    port: int
    namespace: str = ""
    service: str = ""
    host: str = ""
    ip: str = ""
    instance: str = ""

    def __str__(self) -> str:
        if self.ip:
            address = f"[{self.ip}]" if ":" in self.ip else self.ip
            return f"{address}:{self.port}"
        name = self.host or f"{self.service}.{self.namespace}"
        return f"{name}:{self.port}"


@dataclass(frozen=True, slots=True)
class RetryBudget:
    retry_ratio: float = 0.2
    min_retries_per_second: int = 10
    ttl_seconds: float = 10.0


def parse_authority(path: str, cluster_domain: str = "cluster.local") -> Authority:
    """``[<instance>.]<svc>.<ns>.svc.<cluster-domain>[:port]``, ``IP:port`` (``[v6]:port``),
    or another host name of two labels or more (a ServiceEntry's, or nothing: the server
    decides); the port defaults to 80. As Linkerd's ``parseK8sServiceName``, a service is
    named only in full: ``<svc>.<ns>`` is a host name like any other."""
    if not path:
        raise InvalidAuthority("path is empty: expected <service>.<namespace>.svc.<domain>:<port>")
    if len(path) > 300:
        raise InvalidAuthority(f"path is {len(path)} characters long; at most 300")
    host, port = _split_port(path)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return Authority(port, ip=str(ip))
    name = host.lower().rstrip(".")
    labels = name.split(".")
    for label in labels:
        try:
            ids.validate_dns_label(label, "name")
        except ids.InvalidIdentifier as exc:
            raise InvalidAuthority(f"path {path!r}: {exc}") from None
    suffix = ["svc", *cluster_domain.split(".")]
    if labels[-len(suffix) :] == suffix:
        head = labels[: -len(suffix)]
        if len(head) == 2:
            return Authority(port, namespace=head[1], service=head[0], host=name)
        if len(head) == 3:
            return Authority(port, namespace=head[2], service=head[1], host=name, instance=head[0])
    if len(labels) == 1:
        raise InvalidAuthority(
            f"path {path!r} names no namespace: expected <service>.<namespace>.svc.{cluster_domain}"
        )
    return Authority(port, host=name)


def _split_port(path: str) -> tuple[str, int]:
    if path.startswith("["):
        host, sep, rest = path[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise InvalidAuthority(f"path {path!r}: unbalanced brackets around an IPv6 address")
        port_text = rest[1:] if rest else ""
    elif path.count(":") > 1:  # a bare IPv6 address, no port
        host, port_text = path, ""
    else:
        host, _, port_text = path.partition(":")
    if not port_text:
        if path.endswith(":"):
            raise InvalidAuthority(f"path {path!r}: the port is empty")
        return host, DEFAULT_PORT
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidAuthority(f"path {path!r}: port {port_text!r} is not a number in 1..65535")
    return host, int(port_text)


def fqdn(namespace: str, service: str, cluster_domain: str) -> str:
    return f"{service}.{namespace}.svc.{cluster_domain}"


# -- addresses -------------------------------------------------------------------------


def endpoint_key(endpoint: cpb.ClusterEndpoint) -> tuple[str, int] | None:
    """``(ip, port)``; None for an endpoint that is not an IP (a DNS ServiceEntry's)."""
    try:
        return str(ipaddress.ip_address(endpoint.address)), endpoint.port
    except ValueError:
        return None


def tcp_address(ip: str, port: int) -> net_pb2.TcpAddress:
    address = ipaddress.ip_address(ip)
    if address.version == 4:
        return net_pb2.TcpAddress(ip=net_pb2.IPAddress(ipv4=int(address)), port=port)
    value = int(address)
    six = net_pb2.IPv6(first=value >> 64, last=value & ((1 << 64) - 1))
    return net_pb2.TcpAddress(ip=net_pb2.IPAddress(ipv6=six), port=port)


def address_text(address: net_pb2.TcpAddress | conduit_common.TcpAddress) -> str:
    """``ip:port`` of a wire address (for clients, the CLI and tests)."""
    if address.ip.WhichOneof("ip") == "ipv6":
        value = (address.ip.ipv6.first << 64) | address.ip.ipv6.last
        return f"[{ipaddress.IPv6Address(value)}]:{address.port}"
    return f"{ipaddress.IPv4Address(address.ip.ipv4)}:{address.port}"


def set_labels(namespace: str, service: str) -> dict[str, str]:
    return {"namespace": namespace, "service": service}


def endpoint_labels(endpoint: cpb.ClusterEndpoint) -> dict[str, str]:
    labels = dict(endpoint.labels)
    labels["zone"] = endpoint.locality
    if endpoint.service_account:
        labels["serviceaccount"] = endpoint.service_account
    if endpoint.provider:
        labels["provider"] = endpoint.provider
    kind, _, name = _workload(endpoint)
    if name:
        labels["pod" if kind == "Pod" else "workload"] = name
    return labels


def _workload(endpoint: cpb.ClusterEndpoint) -> tuple[str, str, str]:
    """(kind, namespace, name) of the workload behind an endpoint."""
    namespace, sep, name = endpoint.workload.partition("/")
    if not sep:
        namespace, name = "", endpoint.workload
    kind = "Pod" if endpoint.provider == "endpoints-k8s" else "Workload"
    return kind, namespace, name


def weighted_addr(
    destination: cpb.Destination,
    cluster: cpb.Cluster,
    endpoint: cpb.ClusterEndpoint,
    key: tuple[str, int],
    cluster_domain: str,
) -> dpb.WeightedAddr:
    """One endpoint (at ``key``, its :func:`endpoint_key`) as Linkerd's address."""
    addr = dpb.WeightedAddr(
        addr=tcp_address(*key),
        weight=ENDPOINT_WEIGHT * max(endpoint.weight, 1),
        metric_labels=endpoint_labels(endpoint),
    )
    if cluster.mesh_tls and endpoint.service_account:
        trust = destination.trust_domain
        spiffe = f"spiffe://{trust}/ns/{destination.namespace}/sa/{endpoint.service_account}"
        addr.tls_identity.uri_like_identity.uri = spiffe
        addr.tls_identity.server_name.name = fqdn(
            destination.namespace, destination.name, cluster_domain
        )
    if cluster.mesh_tls:
        if is_opaque(destination, cluster):
            addr.protocol_hint.opaque.SetInParent()
        elif cluster.protocol in ("http2", "grpc"):
            addr.protocol_hint.h2.SetInParent()
    kind, namespace, name = _workload(endpoint)
    if name:
        addr.resource_ref.resource.CopyFrom(
            meta_pb2.Resource(
                group="", kind=kind, name=name, namespace=namespace or destination.namespace
            )
        )
    return addr


def conduit_weighted_addr(addr: dpb.WeightedAddr) -> conduit.WeightedAddr:
    """The conduit API's address: the same address, weight and labels (it has no more)."""
    return conduit.WeightedAddr(
        addr=conduit_common.TcpAddress.FromString(addr.addr.SerializeToString()),
        weight=addr.weight,
        metric_labels=addr.metric_labels,
    )


def is_opaque(destination: cpb.Destination, cluster: cpb.Cluster) -> bool:
    """Whether a Linkerd client should treat the port as opaque TCP: a TCP port, or one of
    the destination's opaque ports (its Service's annotation, else Linkerd's defaults)."""
    return cluster.protocol == "tcp" or cluster.port in destination.opaque_ports


def is_service_entry(destination: cpb.Destination) -> bool:
    """A ServiceEntry has hosts; a Service is found by its cluster names."""
    return bool(destination.hosts)


def without_ip(cluster: cpb.Cluster) -> bool:
    """A ServiceEntry port with no IP endpoint to send: resolved by DNS (``DNS``,
    ``LOGICAL_DNS``) or not at all (``PASSTHROUGH``), or whose static endpoints are none of
    them IPs (``unix:///`` paths: a socket on the Envoy proxy's own host)."""
    if any(endpoint_key(e) is not None for e in cluster.endpoints):
        return False
    return cluster.discovery != "STATIC" or bool(cluster.endpoints)


def port_cluster(destination: cpb.Destination, port: int) -> cpb.Cluster | None:
    """The cluster of the service port ``port``; None if the service has no such port."""
    for cluster in destination.ports:
        if cluster.port == port:
            return cluster
    return None


def addresses(
    destination: cpb.Destination, port: int, cluster_domain: str
) -> dict[tuple[str, int], dpb.WeightedAddr]:
    """Every endpoint of ``destination``'s ``port`` as Linkerd's addresses, by ``(ip, port)``."""
    cluster = port_cluster(destination, port)
    if cluster is None:
        return {}
    found = {}
    for endpoint in cluster.endpoints:
        key = endpoint_key(endpoint)
        if key is not None:
            found[key] = weighted_addr(destination, cluster, endpoint, key, cluster_domain)
    return found


def instance_addresses(
    destination: cpb.Destination, port: int, instance: str, cluster_domain: str
) -> dict[tuple[str, int], dpb.WeightedAddr]:
    """The endpoints of ``destination``'s ``port`` whose workload is named ``instance``: a
    pod (a StatefulSet's pod DNS name is ``<pod>.<service>...``) or a VM workload."""
    cluster = port_cluster(destination, port)
    if cluster is None:
        return {}
    found = {}
    for endpoint in cluster.endpoints:
        key = endpoint_key(endpoint)
        if key is not None and _workload(endpoint)[2] == instance:
            found[key] = weighted_addr(destination, cluster, endpoint, key, cluster_domain)
    return found


def find_endpoint(
    destinations: Iterable[cpb.Destination], ip: str, port: int
) -> tuple[cpb.Destination, cpb.Cluster, cpb.ClusterEndpoint] | None:
    for destination in destinations:
        for cluster in destination.ports:
            for endpoint in cluster.endpoints:
                if endpoint_key(endpoint) == (ip, port):
                    return destination, cluster, endpoint
    return None


# -- profiles --------------------------------------------------------------------------


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(int(seconds * 1e9))
    return duration


def path_regex(match: cpb.HttpMatch) -> str:
    """The match's path as the whole-path regex Linkerd's ``PathMatch`` is: a Gateway API
    exact path, or prefix by whole segments, else the SMI regex."""
    if match.path_exact:
        return re.escape(match.path_exact)
    if match.path_prefix:
        return re.escape(match.path_prefix.rstrip("/")) + "(?:/.*)?"
    return match.path_regex or ".*"


def request_match(match: cpb.HttpMatch) -> dpb.RequestMatch:
    """A route's match: its path, and any of its methods (headers and query parameters have
    no place in the API's RequestMatch, so a distinction by them alone is not made:
    docs/linkerd.md)."""
    parts = [dpb.RequestMatch(path=dpb.PathMatch(regex=path_regex(match)))]
    methods = [_method(m) for m in match.methods]
    if len(methods) == 1:
        parts.append(dpb.RequestMatch(method=methods[0]))
    elif methods:
        any_of = [dpb.RequestMatch(method=m) for m in methods]
        parts.append(dpb.RequestMatch(any=dpb.RequestMatch.Seq(matches=any_of)))
    if len(parts) == 1:
        return parts[0]
    return dpb.RequestMatch(all=dpb.RequestMatch.Seq(matches=parts))


def _method(name: str) -> http_types_pb2.HttpMethod:
    if name in _METHODS:
        return http_types_pb2.HttpMethod(registered=_METHODS[name])  # type: ignore[arg-type]
    return http_types_pb2.HttpMethod(unregistered=name)


def _server_errors() -> dpb.ResponseClass:
    status = dpb.ResponseMatch(status=dpb.HttpStatusRange(min=500, max=599))
    return dpb.ResponseClass(condition=status, is_failure=True)


def _resource(group: str, kind: str, namespace: str, name: str, port: int = 0) -> meta_pb2.Metadata:
    return meta_pb2.Metadata(
        resource=meta_pb2.Resource(
            group=group, kind=kind, namespace=namespace, name=name, port=port
        )
    )


def overrides(
    destination: cpb.Destination, port: int, cluster_domain: str
) -> list[dpb.WeightedDst]:
    """The TrafficSplit's backends, weights in decimillis (they sum to 10,000); a backend
    with weight 0 gets none."""
    total = sum(b.weight for b in destination.splits)
    if total <= 0:
        return []
    found = []
    for backend in destination.splits:
        if backend.weight <= 0:
            continue
        name = fqdn(backend.namespace, backend.name, cluster_domain)
        backend_port = backend.port or port
        found.append(
            dpb.WeightedDst(
                authority=f"{name}:{backend_port}",
                weight=round(SPLIT_TOTAL * backend.weight / total),
                backend_ref=_resource(
                    "core", "Service", backend.namespace, backend.name, backend_port
                ),
            )
        )
    return found


def profile(
    destination: cpb.Destination | None,
    port: int,
    budget: RetryBudget,
    cluster_domain: str,
) -> dpb.DestinationProfile:
    """The profile of a service port; an unknown service gets the default profile with an
    empty fully qualified name (the API's "unknown"), and so does a ServiceEntry's name
    and parent: it is no Kubernetes Service (the seed: "If the lookup does not refer to a
    known named entity, this field MUST be left empty"; ``parent_ref`` "may be omitted if
    the destination is not a service")."""
    answer = dpb.DestinationProfile(
        retry_budget=dpb.RetryBudget(
            retry_ratio=budget.retry_ratio,
            min_retries_per_second=budget.min_retries_per_second,
            ttl=_duration(budget.ttl_seconds),
        )
    )
    if destination is None:
        return answer
    namespace, name = destination.namespace, destination.name
    if not is_service_entry(destination):
        answer.fully_qualified_name = fqdn(namespace, name, cluster_domain)
        answer.parent_ref.CopyFrom(_resource("core", "Service", namespace, name, port))
    cluster = port_cluster(destination, port)
    answer.opaque_protocol = (
        port in destination.opaque_ports if cluster is None else is_opaque(destination, cluster)
    )
    for route in destination.routes:
        if route.port and route.port != port:
            continue
        found = dpb.Route(
            condition=request_match(route.match),
            response_classes=[_server_errors()],
            metrics_labels={"route": route.name},
            is_retryable=destination.retried,
        )
        if route.timeout > 0:
            found.timeout.CopyFrom(_duration(route.timeout))
        answer.routes.append(found)
    answer.dst_overrides.extend(overrides(destination, port, cluster_domain))
    if destination.split:
        split_namespace, _, split_name = destination.split.partition("/")
        answer.profile_ref.CopyFrom(
            _resource("split.smi-spec.io", "TrafficSplit", split_namespace, split_name)
        )
    return answer


def endpoint_profile(
    addr: dpb.WeightedAddr,
    destination: cpb.Destination,
    cluster: cpb.Cluster,
    budget: RetryBudget,
) -> dpb.DestinationProfile:
    answer = profile(None, 0, budget, "")
    answer.endpoint.CopyFrom(addr)
    answer.opaque_protocol = is_opaque(destination, cluster)
    return answer
