"""The catalog's answer for one service identity, as frozen values.

A view has two halves, like Envoy's CDS and EDS. :class:`IdentityPolicy` is what the
identity may reach and who may reach it, recomputed when the specification changes.
:class:`ClusterState` is one service port's endpoints, shared by every view that references
it and rebuilt when a provider reports a change. A view's version changes when either half
does, and only then: versions are digests of the content (:mod:`.contentversion`), the
same on every catalog replica.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

# the spec's match values are part of every view: the catalog names them from here
from trellis_spec.matches import MATCH_ALL as MATCH_ALL
from trellis_spec.matches import Headers as Headers
from trellis_spec.matches import HttpMatch as HttpMatch
from trellis_spec.matches import ValueMatch as ValueMatch


class Identity(NamedTuple):
    """A service identity: the proxies of one service (``<namespace>/<service>``)."""

    namespace: str
    service: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service}"

    @classmethod
    def parse(cls, text: str) -> Identity:
        namespace, sep, service = text.partition("/")
        if not sep or not namespace or not service or "/" in service:
            raise ValueError(f"identity {text!r} must be '<namespace>/<service>'")
        return cls(namespace, service)


@dataclass(frozen=True, slots=True)
class HeaderEdits:
    """A Gateway API header modifier: headers to set, to add, and names to remove."""

    set: Headers = ()
    add: Headers = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class WeightedCluster:
    """A route's share of traffic to one cluster (a TrafficSplit backend's weight); an empty
    ``cluster`` is an invalid backend's share, answered with the route's error status."""

    cluster: str
    weight: int
    request_headers: HeaderEdits | None = None
    response_headers: HeaderEdits | None = None


@dataclass(frozen=True, slots=True)
class Mirror:
    """Copies of a share (numerator/denominator) of the requests go to ``cluster``."""

    cluster: str
    numerator: int = 100
    denominator: int = 100


@dataclass(frozen=True, slots=True)
class Redirect:
    scheme: str = ""
    hostname: str = ""
    port: int = 0
    status_code: int = 302
    full_path: str = ""
    prefix_path: str = ""
    matched_prefix: str = ""


@dataclass(frozen=True, slots=True)
class Rewrite:
    hostname: str = ""
    full_path: str = ""
    prefix_path: str = ""
    matched_prefix: str = ""


@dataclass(frozen=True, slots=True)
class Route:
    """Requests matching ``match`` go to ``clusters``, split by their weights.

    A Gateway API route also carries its filters, timeouts and error statuses, and the
    names it applies to (``hostnames``; empty: all of the service's)."""

    name: str
    match: HttpMatch
    clusters: tuple[WeightedCluster, ...]
    hostnames: tuple[str, ...] = ()
    request_headers: HeaderEdits | None = None
    response_headers: HeaderEdits | None = None
    mirrors: tuple[Mirror, ...] = ()
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    timeout: float | None = None
    backend_timeout: float | None = None
    direct_status: int = 0
    invalid_status: int = 0
    source: str = ""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """An OSM Retry policy as the client's routes to one service apply it."""

    policy: str  # "<namespace>/<name>" of the Retry
    retry_on: str
    num_retries: int | None = None  # None: Envoy's default (1)
    per_try_timeout: float | None = None  # seconds; None: the route's timeout
    backoff_base_interval: float | None = None  # seconds; None: Envoy's 25 ms


@dataclass(frozen=True, slots=True)
class OutboundService:
    namespace: str
    name: str
    port: int
    protocol: str
    hostnames: tuple[str, ...]
    routes: tuple[Route, ...]
    spiffe_ids: tuple[str, ...]
    retry: RetryPolicy | None = None
    # A TCP destination whose port another destination of this client takes (a client of a
    # TCP service connects to the port, with no name to tell them apart): "<ns>/<name>" of
    # the one it gets there. Its listener is not made.
    shadowed_by: str = ""
    # Where a captured connection to it goes (ClusterIPs, or the endpoints' addresses).
    addresses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ExternalService:
    host: str
    port: int
    protocol: str  # http, http2, grpc, tcp; or a ServiceEntry's tls, https, mongo
    cluster: str
    addresses: tuple[str, ...]
    source: str


@dataclass(frozen=True, slots=True)
class InboundRule:
    policy: str
    source_spiffe_ids: tuple[str, ...]
    http: tuple[HttpMatch, ...] = ()
    tcp_ports: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class LocalRateLimit:
    """An OSM local rate limit as Envoy's token bucket (the destination's inbound)."""

    policy: str  # "<namespace>/<name>" of the UpstreamTrafficSetting
    tokens_per_fill: int
    max_tokens: int
    fill_interval: float  # seconds
    status: int = 0  # 0: Envoy's 429
    response_headers: Headers = ()


@dataclass(frozen=True, slots=True)
class IngressRule:
    """An OSM IngressBackend's admission to one inbound port, from outside the mesh."""

    policy: str  # "<namespace>/<name>" of the IngressBackend
    protocol: str  # http: plaintext; https: mTLS
    # the client addresses admitted (CIDRs); empty: any address
    source_ranges: tuple[str, ...] = ()
    # https: the names a client certificate must carry (URI or DNS SAN, or subject)
    principals: tuple[str, ...] = ()
    sni_hosts: tuple[str, ...] = ()  # https: the TLS server names admitted; empty: any
    # https: any client certificate (tls.skipClientCertValidation), told apart from the
    # mesh's traffic by source_ranges or sni_hosts
    skip_client_cert_validation: bool = False


@dataclass(frozen=True, slots=True)
class InboundPort:
    port: int
    target_port: int
    protocol: str
    name: str
    rules: tuple[InboundRule, ...]
    allow_any: bool = False
    rate_limit: LocalRateLimit | None = None
    route_limits: tuple[tuple[str, LocalRateLimit], ...] = ()  # (path regex, limit)
    ingress: IngressRule | None = None


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """An UpstreamTrafficSetting's outlierDetection, for the clients' clusters."""

    consecutive_5xx: int | None = None
    consecutive_gateway_errors: int | None = None
    interval: float | None = None  # seconds
    base_ejection_time: float | None = None  # seconds
    max_ejection_percent: int | None = None


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """An OSM UpstreamTrafficSetting's connectionSettings, for the clients' clusters (None:
    Envoy's/OSM's default)."""

    policy: str  # "<namespace>/<name>" of the UpstreamTrafficSetting
    max_connections: int | None = None
    connect_timeout: float | None = None  # seconds
    max_requests: int | None = None
    max_requests_per_connection: int | None = None
    max_pending_requests: int | None = None
    max_retries: int | None = None
    outlier: OutlierDetection | None = None


@dataclass(frozen=True, slots=True)
class EgressRoute:
    """What OSM Egress policies let an identity reach outside the mesh on one port: an
    ``http`` host (its requests narrowed by ``matches``), an ``https`` host (any host when
    empty), or ``tcp`` addresses (``ip_ranges``; any when empty)."""

    policies: tuple[str, ...]  # "<namespace>/<name>" of each Egress that allows it
    protocol: str  # http, https, tcp
    port: int
    host: str = ""
    ip_ranges: tuple[str, ...] = ()
    matches: tuple[HttpMatch, ...] = ()  # http: the requests allowed; empty: all
    connection: ConnectionSettings | None = None  # an UpstreamTrafficSetting the Egress names


@dataclass(frozen=True, slots=True)
class ClusterRef:
    """What a policy needs to know of a cluster before its endpoints are known."""

    name: str
    namespace: str
    service: str
    port: int
    protocol: str
    discovery: str  # STATIC, DNS, LOGICAL_DNS, PASSTHROUGH
    mesh_tls: bool
    subject_alt_names: tuple[str, ...] = ()
    # The service accounts of the endpoints this view's identity may reach, when not all
    # (empty: all). "" stands for endpoints that name no account.
    accounts: tuple[str, ...] = ()
    connection: ConnectionSettings | None = None


@dataclass(frozen=True, slots=True, order=True)
class ClusterEndpoint:
    address: str
    port: int
    weight: int = 1
    locality: str = ""
    service_account: str = ""
    provider: str = ""
    labels: Headers = ()
    workload: str = ""


@dataclass(frozen=True, slots=True)
class ClusterState:
    ref: ClusterRef
    endpoints: tuple[ClusterEndpoint, ...]
    spiffe_ids: tuple[str, ...]
    version: str = ""  # a digest of the rest (:mod:`.contentversion`); "": not versioned


@dataclass(frozen=True, slots=True)
class Tracing:
    """MeshConfig ``observability.tracing``: where sidecars send Zipkin v2 spans."""

    address: str
    port: int
    endpoint: str


@dataclass(frozen=True, slots=True)
class MeshSettings:
    trust_domain: str = "cluster.local"
    permissive: bool = False
    egress: bool = False
    tracing: Tracing | None = None
    locality_failover: bool = False  # MeshConfig traffic.enableLocalityFailover


@dataclass(frozen=True, slots=True)
class GatewayVirtualHost:
    """The routes a gateway listener serves for some host names (Envoy's spelling: ``*``
    any, ``*.example.com`` a suffix), in precedence order, ending with the catch-all."""

    domains: tuple[str, ...]
    routes: tuple[Route, ...]


@dataclass(frozen=True, slots=True)
class GatewayTlsRoute:
    """A TLSRoute on a passthrough listener: connections for these server names go, still
    encrypted, to the weighted clusters."""

    hostnames: tuple[str, ...]
    clusters: tuple[WeightedCluster, ...]
    source: str  # "TLSRoute <namespace>/<name>"


@dataclass(frozen=True, slots=True)
class GatewayServer:
    """One listener of a Gateway with the routes attached to it."""

    listener: str  # "<namespace>/<gateway>/<listener name>"
    hostname: str = ""  # HTTPS/TLS: the TLS server name; "": any
    tls_mode: str = ""  # HTTPS/TLS: Terminate or Passthrough
    certificates: tuple[tuple[str, str], ...] = ()  # Terminate: (namespace, name) of Secrets
    virtual_hosts: tuple[GatewayVirtualHost, ...] = ()
    tls_routes: tuple[GatewayTlsRoute, ...] = ()  # TLS Passthrough


@dataclass(frozen=True, slots=True)
class GatewayPort:
    """The listeners of one Gateway on one port, all of one protocol."""

    port: int
    protocol: str  # HTTP, HTTPS, TLS
    servers: tuple[GatewayServer, ...]


@dataclass(frozen=True, slots=True)
class IdentityPolicy:
    identity: Identity
    service_account: str
    spiffe_id: str
    mesh: MeshSettings
    outbound: tuple[OutboundService, ...]
    external: tuple[ExternalService, ...]
    inbound: tuple[InboundPort, ...]
    clusters: tuple[ClusterRef, ...] = field(default=())
    egress: tuple[EgressRoute, ...] = ()
    gateway: tuple[GatewayPort, ...] = ()  # a Gateway's identity: what its Envoy serves

    @property
    def cluster_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.clusters)
