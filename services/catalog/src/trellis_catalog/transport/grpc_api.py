"""The ``trellis.catalog.v1.Catalog`` servicer: views and their versions, policy, proxies.

Consumers follow views on the one event path: the Redis signal ``views`` rings after a
flush, and they ask ``ListViewVersions(since=<their cursor>)`` what changed, then
``GetView`` for the identities they want. Every version in an answer (a view's, a
cluster's, a destination's) is a digest of its content, the same from every catalog
replica; the cursors and the ``revision`` fields are the answering replica's own (see
:mod:`trellis_catalog.catalog`).

Requests are checked first (:mod:`.grpc_requests`); a bad field is refused through the
service's :class:`~trellis_common.grpcrequests.RequestGate`: INVALID_ARGUMENT naming the
field, logged, counted and shown in ``/v1/status``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import grpc

from trellis_api import catalog_pb2 as pb
from trellis_api import catalog_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog, UnknownProxy
from trellis_catalog.domain.access import explain
from trellis_catalog.domain.destinations import Destination
from trellis_catalog.domain.spec import MeshSpec
from trellis_catalog.domain.views import (
    ClusterEndpoint,
    ClusterRef,
    ClusterState,
    ConnectionSettings,
    GatewayPort,
    HeaderEdits,
    HttpMatch,
    IdentityPolicy,
    LocalRateLimit,
    RetryPolicy,
    Route,
)
from trellis_catalog.transport import grpc_requests
from trellis_common import messages
from trellis_common.grpcrequests import InvalidField, RequestGate, rpc
from trellis_common.health import Rejections
from trellis_common.memo import Members

Context = grpc.aio.ServicerContext[Any, Any]
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Catalog"].full_name


def _match(match: HttpMatch) -> pb.HttpMatch:
    return pb.HttpMatch(
        path_regex=match.path_regex,
        methods=match.methods,
        headers=dict(match.headers),
        path_exact=match.path_exact,
        path_prefix=match.path_prefix,
        header_matches=[pb.ValueMatch(**messages.fields(m)) for m in match.header_matches],
        query_params=[pb.ValueMatch(**messages.fields(m)) for m in match.query_params],
    )


def _rate_limit(limit: LocalRateLimit | None) -> pb.LocalRateLimit | None:
    if limit is None:
        return None
    return pb.LocalRateLimit(
        policy=limit.policy,
        tokens_per_fill=limit.tokens_per_fill,
        max_tokens=limit.max_tokens,
        fill_interval=limit.fill_interval,
        status=limit.status,
        response_headers=[pb.Header(name=n, value=v) for n, v in limit.response_headers],
    )


def _edits(edits: HeaderEdits | None) -> pb.HeaderEdits | None:
    if edits is None:
        return None
    return pb.HeaderEdits(
        set=[pb.Header(name=n, value=v) for n, v in edits.set],
        add=[pb.Header(name=n, value=v) for n, v in edits.add],
        remove=edits.remove,
    )


def _route(route: Route) -> pb.Route:
    return pb.Route(
        name=route.name,
        match=_match(route.match),
        clusters=[
            pb.WeightedCluster(
                cluster=c.cluster,
                weight=c.weight,
                request_headers=_edits(c.request_headers),
                response_headers=_edits(c.response_headers),
            )
            for c in route.clusters
        ],
        hostnames=route.hostnames,
        request_headers=_edits(route.request_headers),
        response_headers=_edits(route.response_headers),
        mirrors=[pb.Mirror(**messages.fields(m)) for m in route.mirrors],
        redirect=pb.Redirect(**messages.fields(route.redirect)) if route.redirect else None,
        rewrite=pb.Rewrite(**messages.fields(route.rewrite)) if route.rewrite else None,
        timeout=route.timeout,
        backend_timeout=route.backend_timeout,
        direct_status=route.direct_status,
        invalid_status=route.invalid_status,
        source=route.source,
    )


def _gateway_port(port: GatewayPort) -> pb.GatewayPort:
    return pb.GatewayPort(
        port=port.port,
        protocol=port.protocol,
        servers=[
            pb.GatewayServer(
                listener=s.listener,
                hostname=s.hostname,
                tls_mode=s.tls_mode,
                certificates=[pb.SecretRef(namespace=n, name=m) for n, m in s.certificates],
                virtual_hosts=[
                    pb.GatewayVirtualHost(domains=v.domains, routes=[_route(r) for r in v.routes])
                    for v in s.virtual_hosts
                ],
                tls_routes=[
                    pb.GatewayTlsRoute(
                        hostnames=t.hostnames,
                        clusters=[
                            pb.WeightedCluster(cluster=c.cluster, weight=c.weight)
                            for c in t.clusters
                        ],
                        source=t.source,
                    )
                    for t in s.tls_routes
                ],
            )
            for s in port.servers
        ],
    )


def reachable(state: ClusterState, ref: ClusterRef) -> ClusterState:
    """The cluster as one view sees it: only the endpoints of the accounts its identity may
    reach when the policy's reference limits them (OSM sends a client no other endpoint),
    and only those accounts' SPIFFE ids to verify; with the policy's connection settings."""
    if ref.connection != state.ref.connection:
        state = replace(state, ref=replace(state.ref, connection=ref.connection))
    if not ref.accounts:
        return state
    accounts = set(ref.accounts)
    endpoints = tuple(e for e in state.endpoints if e.service_account in accounts)
    spiffe = tuple(i for i in state.spiffe_ids if i.rpartition("/sa/")[2] in accounts)
    return replace(state, endpoints=endpoints, spiffe_ids=spiffe)


def _retry(retry: RetryPolicy | None) -> pb.RetryPolicy | None:
    if retry is None:
        return None
    return pb.RetryPolicy(
        policy=retry.policy,
        retry_on=retry.retry_on,
        num_retries=retry.num_retries,
        per_try_timeout=retry.per_try_timeout,
        backoff_base_interval=retry.backoff_base_interval,
    )


def _connection(settings: ConnectionSettings) -> pb.ConnectionSettings:
    fields = messages.fields(settings)
    outlier = fields.pop("outlier")
    message = pb.ConnectionSettings(**fields)
    if outlier is not None:
        message.outlier_detection.CopyFrom(pb.OutlierDetection(**messages.fields(outlier)))
    return message


def _sidecar(spec: MeshSpec) -> pb.SidecarSettings:
    """MeshConfig's settings of every sidecar (the injector applies them to a new pod)."""
    settings = spec.settings
    if settings is None:
        return pb.SidecarSettings()
    return pb.SidecarSettings(
        log_level=settings.sidecar_log_level or "",
        inbound_port_exclusions=settings.inbound_port_exclusions,
        outbound_port_exclusions=settings.outbound_port_exclusions,
        outbound_ip_range_exclusions=settings.outbound_ip_range_exclusions,
    )


def _endpoint(endpoint: ClusterEndpoint, _: object) -> pb.ClusterEndpoint:
    return pb.ClusterEndpoint(**messages.fields(endpoint, maps={"labels"}))


class ClusterProtos:
    """Clusters as messages, their endpoint messages kept while the endpoint is the same
    object (:class:`~trellis_common.memo.Members`), per cluster and the accounts a view's
    reference limits it to: an answer after one endpoint of 200 moved converts one."""

    def __init__(self) -> None:
        self._endpoints: Members[tuple[str, tuple[str, ...]], ClusterEndpoint, pb.ClusterEndpoint]
        self._endpoints = Members(_endpoint)

    def __call__(self, state: ClusterState, accounts: tuple[str, ...] = ()) -> pb.Cluster:
        ref = state.ref
        return pb.Cluster(
            name=ref.name,
            namespace=ref.namespace,
            service=ref.service,
            port=ref.port,
            protocol=ref.protocol,
            discovery=ref.discovery,
            endpoints=self._endpoints.convert((ref.name, accounts), state.endpoints),
            spiffe_ids=state.spiffe_ids,
            mesh_tls=ref.mesh_tls,
            version=state.version,
            subject_alt_names=ref.subject_alt_names,
            connection=_connection(ref.connection) if ref.connection is not None else None,
        )

    def prune(self, clusters: Mapping[str, ClusterState]) -> None:
        """Forget clusters that are gone, once they may outnumber those that are not."""
        if len(self._endpoints) > 2 * len(clusters) + 64:
            self._endpoints.retain(lambda c: c[0] in clusters)


def destination_proto(
    catalog: Catalog, record: Destination, protos: ClusterProtos | None = None
) -> pb.Destination:
    service = record.service
    cluster = protos or ClusterProtos()
    ports = []
    for name in record.clusters:
        state = catalog.clusters.get(name)
        if state is not None:
            ports.append(cluster(state))
    return pb.Destination(
        namespace=service.namespace,
        name=service.name,
        version=catalog.destinations.versions.get(service, ""),
        addresses=record.addresses,
        hosts=record.hosts,
        ports=ports,
        routes=[
            pb.ProfileRoute(name=r.name, match=_match(r.match), timeout=r.timeout, port=r.port)
            for r in record.routes
        ],
        splits=[
            pb.SplitBackend(
                namespace=b.service.namespace, name=b.service.name, weight=b.weight, port=b.port
            )
            for b in record.splits
        ],
        split=record.split,
        trust_domain=record.trust_domain,
        retried=record.retried,
        opaque_ports=record.opaque_ports,
    )


def to_proto(
    catalog: Catalog, policy: IdentityPolicy, protos: ClusterProtos | None = None
) -> pb.View:
    identity = policy.identity
    cluster = protos or ClusterProtos()
    certificate = catalog.certificates.get(identity)
    clusters = [
        (reachable(catalog.clusters.get(ref.name, ClusterState(ref, (), ())), ref), ref.accounts)
        for ref in policy.clusters
    ]
    return pb.View(
        identity=str(identity),
        namespace=identity.namespace,
        service=identity.service,
        service_account=policy.service_account,
        spiffe_id=policy.spiffe_id,
        version=catalog.version_of(identity),
        revision=catalog.revision,
        mesh=pb.MeshSettings(
            trust_domain=policy.mesh.trust_domain,
            permissive=policy.mesh.permissive,
            egress=policy.mesh.egress,
            locality_failover=policy.mesh.locality_failover,
            tracing=pb.Tracing(**messages.fields(policy.mesh.tracing))
            if policy.mesh.tracing is not None
            else None,
        ),
        outbound=[
            pb.OutboundService(
                namespace=o.namespace,
                name=o.name,
                port=o.port,
                protocol=o.protocol,
                hostnames=o.hostnames,
                routes=[_route(r) for r in o.routes],
                spiffe_ids=o.spiffe_ids,
                retry=_retry(o.retry),
                shadowed_by=o.shadowed_by,
                addresses=o.addresses,
            )
            for o in policy.outbound
        ],
        external=[pb.ExternalService(**messages.fields(e)) for e in policy.external],
        inbound=[
            pb.InboundPort(
                port=i.port,
                target_port=i.target_port,
                protocol=i.protocol,
                name=i.name,
                allow_any=i.allow_any,
                rate_limit=_rate_limit(i.rate_limit),
                route_limits=[
                    pb.RouteRateLimit(path=path, limit=_rate_limit(limit))
                    for path, limit in i.route_limits
                ],
                rules=[
                    pb.InboundRule(
                        policy=r.policy,
                        source_spiffe_ids=r.source_spiffe_ids,
                        http=[_match(m) for m in r.http],
                        tcp_ports=r.tcp_ports,
                    )
                    for r in i.rules
                ],
                ingress=pb.IngressRule(**messages.fields(i.ingress)) if i.ingress else None,
            )
            for i in policy.inbound
        ],
        egress=[
            pb.EgressRoute(
                policies=e.policies,
                protocol=e.protocol,
                port=e.port,
                host=e.host,
                ip_ranges=e.ip_ranges,
                matches=[_match(m) for m in e.matches],
                connection=_connection(e.connection) if e.connection else None,
            )
            for e in policy.egress
        ],
        clusters=[cluster(c, accounts) for c, accounts in clusters],
        gateway_ports=[_gateway_port(p) for p in policy.gateway],
        certificate=pb.CertificateRef(
            common_name=certificate.common_name,
            serial=certificate.serial,
            trust_bundle_fingerprint=certificate.trust_bundle_fingerprint,
        )
        if certificate
        else None,
    )


@contextlib.contextmanager
def _named_proxy() -> Iterator[None]:
    """UnknownProxy as the request's fault: the request checks should have caught the name."""
    try:
        yield
    except UnknownProxy as exc:
        raise InvalidField("common_name", str(exc)) from None


class CatalogServicer(pb_grpc.CatalogServicer):
    def __init__(self, catalog: Catalog, rejections: Rejections | None = None) -> None:
        self._catalog = catalog
        self.gate = RequestGate(rejections)
        self._clusters = ClusterProtos()

    @rpc(grpc_requests.view)
    async def GetView(self, asked: grpc_requests.ViewRequest, context: Context) -> pb.View:
        await self._catalog.settled()
        self._clusters.prune(self._catalog.clusters)
        policy = self._catalog.policy_for(asked.identity, asked.service_account)
        return to_proto(self._catalog, policy, self._clusters)

    async def ListViewVersions(
        self, request: pb.ListViewVersionsRequest, context: Context
    ) -> pb.ListViewVersionsResponse:
        await self._catalog.settled()
        cursor, full, changed = self._catalog.views_since(grpc_requests.view_cursor(request))
        return pb.ListViewVersionsResponse(
            cursor=cursor,
            full=full,
            identities=[pb.IdentityVersion(identity=i, version=v) for i, v in changed],
        )

    async def ListDestinations(
        self, request: pb.ListDestinationsRequest, context: Context
    ) -> pb.ListDestinationsResponse:
        await self._catalog.settled()
        store = self._catalog.destinations
        cursor, full, changed, removed = store.since(grpc_requests.view_cursor(request))
        return pb.ListDestinationsResponse(
            cursor=cursor,
            full=full,
            destinations=[
                destination_proto(self._catalog, store.records[s], self._clusters) for s in changed
            ],
            removed=[str(s) for s in removed],
        )

    @rpc(grpc_requests.namespace_filter)
    async def ListServices(self, namespace: str, context: Context) -> pb.ListServicesResponse:
        await self._catalog.settled()
        return pb.ListServicesResponse(
            services=[
                pb.ServiceSummary(
                    namespace=s.namespace,
                    name=s.name,
                    providers=k.providers,
                    endpoints=len(k.endpoints),
                    ports=[p.port for p in k.ports],
                    declared=k.declared,
                )
                for s, k in self._catalog.services.items()
                if not namespace or s.namespace == namespace
            ],
            revision=self._catalog.revision,
        )

    @rpc(grpc_requests.policy_question)
    async def CheckPolicy(
        self, question: grpc_requests.PolicyQuestion, context: Context
    ) -> pb.CheckPolicyResponse:
        await self._catalog.settled()
        decision = explain(self._catalog.builder(), question.source, question.destination)
        return pb.CheckPolicyResponse(
            allowed=decision.allowed,
            reason=decision.reason,
            policies=decision.policies,
            routes=[_match(r) for r in decision.routes],
            permissive=decision.permissive,
            conflicts=decision.conflicts,
            shaped_by=decision.shaped_by,
        )

    @rpc(grpc_requests.expected_proxy)
    async def ExpectProxy(self, asked: grpc_requests.ProxyRequest, context: Context) -> pb.ProxyAck:
        with _named_proxy():
            record = self._catalog.expect_proxy(asked.common_name, asked.service_account)
        return pb.ProxyAck(
            identity=str(record.identity), expected=True, sidecar=_sidecar(self._catalog.spec)
        )

    async def GetSidecarSettings(
        self, request: pb.GetSidecarSettingsRequest, context: Context
    ) -> pb.SidecarSettings:
        return _sidecar(self._catalog.spec)

    @rpc(grpc_requests.registered_proxy)
    async def RegisterProxy(
        self, asked: grpc_requests.ProxyRequest, context: Context
    ) -> pb.ProxyAck:
        with _named_proxy():
            record = self._catalog.register_proxy(asked.common_name, asked.proxy_cp, asked.address)
        return pb.ProxyAck(identity=str(record.identity), expected=record.expected)

    @rpc(grpc_requests.unregistered_proxy, statuses={UnknownProxy: grpc.StatusCode.NOT_FOUND})
    async def UnregisterProxy(self, common_name: str, context: Context) -> pb.ProxyAck:
        record = self._catalog.unregister_proxy(common_name)
        return pb.ProxyAck(identity=str(record.identity), expected=record.expected)

    async def ListProxies(
        self, request: pb.ListProxiesRequest, context: Context
    ) -> pb.ListProxiesResponse:
        return pb.ListProxiesResponse(
            proxies=[
                pb.ProxyStatus(
                    common_name=p.common_name,
                    identity=str(p.identity),
                    service_account=p.service_account,
                    expected=p.expected,
                    connected=p.connected,
                    participant=self._catalog.participant(p),
                    proxy_cp=p.proxy_cp,
                    serial=p.serial,
                )
                for p in sorted(self._catalog.proxies.values(), key=lambda p: p.common_name)
            ]
        )
