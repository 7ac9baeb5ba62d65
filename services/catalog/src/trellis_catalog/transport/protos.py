"""The catalog's values as ``trellis.catalog.v1`` messages: policies, slices, destinations,
and the whole view of an identity (its policy with its slices' endpoints) for ``GetView``.

A policy's clusters carry what a client needs before any endpoint (protocol, discovery,
TLS, connection settings) and name their slice (``Cluster.slice``); a slice carries the
endpoints and SPIFFE ids (:mod:`~trellis_catalog.domain.publish.resources`). Slices and
destinations are written as bytes, their endpoints kept encoded while the endpoint is the
same object (:class:`SliceProtos`), so an answer after one endpoint of 200 moved encodes one.
"""

from __future__ import annotations

from collections.abc import Mapping

from trellis_api import catalog_pb2 as pb
from trellis_catalog.domain.model.views import (
    ClusterEndpoint,
    ClusterRef,
    ClusterState,
    ConnectionSettings,
    GatewayPort,
    HeaderEdits,
    HttpMatch,
    IdentityPolicy,
    InboundPort,
    LocalRateLimit,
    RetryPolicy,
    Route,
)
from trellis_catalog.domain.publish.destinations import Destination
from trellis_catalog.domain.publish.resources import Slice, slice_name, slice_of
from trellis_common import messages
from trellis_common.memo import Members


def match_proto(match: HttpMatch) -> pb.HttpMatch:
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
        match=match_proto(route.match),
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


def _endpoint(endpoint: ClusterEndpoint, _: object) -> bytes:
    return messages.delimited(pb.ClusterEndpoint(**messages.fields(endpoint, maps={"labels"})))


class SliceProtos:
    """Slices on the wire, their endpoints kept encoded while the endpoint is the same
    object (:class:`~trellis_common.memo.Members`), per slice name, and joined in one go
    (:func:`~trellis_common.messages.repeated`): a slice, or a destination's cluster, is
    written as bytes without a message of its endpoints ever being made."""

    def __init__(self) -> None:
        self._endpoints: Members[str, ClusterEndpoint, bytes] = Members(_endpoint)

    def __call__(self, name: str, found: Slice, version: str = "") -> pb.ClusterSlice:
        return pb.ClusterSlice.FromString(self.encode(name, found, version))

    def encode(self, name: str, found: Slice, version: str = "") -> bytes:
        """The slice ``name`` (``found``) as a serialized ``ClusterSlice``."""
        head = pb.ClusterSlice(
            cluster=found.cluster,
            accounts=found.accounts,
            spiffe_ids=found.spiffe_ids,
            version=version,
        )
        return head.SerializeToString() + self.endpoints(pb.ClusterSlice, name, found)

    def endpoints(
        self, message: type[pb.ClusterSlice | pb.Cluster], name: str, found: Slice
    ) -> bytes:
        """``found``'s endpoints as ``message``'s repeated ``endpoints`` field on the wire,
        as the slice ``name`` keeps them."""
        encoded = self._endpoints.convert(name, found.endpoints)
        return messages.repeated(message, "endpoints", encoded)

    def prune(self, names: Mapping[str, object]) -> None:
        """Forget slices that are gone, once they may outnumber those that are not."""
        if len(self._endpoints) > 2 * len(names) + 64:
            self._endpoints.retain(lambda name: name in names)


def cluster_ref_proto(ref: ClusterRef) -> pb.Cluster:
    """A policy's cluster: everything but its endpoints, and the slice that has them."""
    return pb.Cluster(
        name=ref.name,
        namespace=ref.namespace,
        service=ref.service,
        port=ref.port,
        protocol=ref.protocol,
        discovery=ref.discovery,
        mesh_tls=ref.mesh_tls,
        subject_alt_names=ref.subject_alt_names,
        connection=_connection(ref.connection) if ref.connection is not None else None,
        slice=slice_name(ref),
    )


def cluster_bytes(state: ClusterState, protos: SliceProtos | None = None) -> bytes:
    """A whole cluster, every endpoint in it (a destination's port), serialized."""
    head = cluster_ref_proto(state.ref)
    head.ClearField("slice")
    whole = slice_of(state, state.ref.name, ())
    head.spiffe_ids.extend(whole.spiffe_ids)
    head.version = state.version
    endpoints = (protos or SliceProtos()).endpoints(pb.Cluster, slice_name(state.ref), whole)
    return head.SerializeToString() + endpoints


#: ``Destination.ports``' field number.
_PORTS = pb.Destination.DESCRIPTOR.fields_by_name["ports"].number


def destination_bytes(
    record: Destination,
    version: str,
    clusters: Mapping[str, ClusterState],
    protos: SliceProtos | None = None,
) -> bytes:
    """A service's destination (the Destination API's), serialized: each port a whole
    cluster, its endpoints written from what ``protos`` keeps encoded."""
    service = record.service
    head = pb.Destination(
        namespace=service.namespace,
        name=service.name,
        version=version,
        addresses=record.addresses,
        hosts=record.hosts,
        routes=[
            pb.ProfileRoute(name=r.name, match=match_proto(r.match), timeout=r.timeout, port=r.port)
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
    ports = [
        messages.field(_PORTS, cluster_bytes(clusters[n], protos))
        for n in record.clusters
        if n in clusters
    ]
    return head.SerializeToString() + b"".join(ports)


def policy_proto(policy: IdentityPolicy, version: str = "", revision: int = 0) -> pb.View:
    """An identity's policy: its view without endpoints (each cluster names its slice)."""
    identity = policy.identity
    return pb.View(
        identity=str(identity),
        namespace=identity.namespace,
        service=identity.service,
        service_account=policy.service_account,
        spiffe_id=policy.spiffe_id,
        version=version,
        revision=revision,
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
        inbound=[_inbound(i) for i in policy.inbound],
        egress=[
            pb.EgressRoute(
                policies=e.policies,
                protocol=e.protocol,
                port=e.port,
                host=e.host,
                ip_ranges=e.ip_ranges,
                matches=[match_proto(m) for m in e.matches],
                connection=_connection(e.connection) if e.connection else None,
            )
            for e in policy.egress
        ],
        clusters=[cluster_ref_proto(ref) for ref in policy.clusters],
        gateway_ports=[_gateway_port(p) for p in policy.gateway],
    )


def _inbound(i: InboundPort) -> pb.InboundPort:
    return pb.InboundPort(
        port=i.port,
        target_port=i.target_port,
        protocol=i.protocol,
        name=i.name,
        allow_any=i.allow_any,
        rate_limit=_rate_limit(i.rate_limit),
        route_limits=[
            pb.RouteRateLimit(path=path, limit=_rate_limit(limit)) for path, limit in i.route_limits
        ],
        rules=[
            pb.InboundRule(
                policy=r.policy,
                source_spiffe_ids=r.source_spiffe_ids,
                http=[match_proto(m) for m in r.http],
                tcp_ports=r.tcp_ports,
            )
            for r in i.rules
        ],
        ingress=pb.IngressRule(**messages.fields(i.ingress)) if i.ingress else None,
    )


def assemble(policy: pb.View, slices: Mapping[str, pb.ClusterSlice]) -> pb.View:
    """The whole view: ``policy`` with each cluster's endpoints and SPIFFE ids from its
    slice (a slice not in ``slices`` leaves its cluster without endpoints)."""
    view = pb.View()
    view.CopyFrom(policy)
    for cluster in view.clusters:
        found = slices.get(cluster.slice)
        if found is not None:
            cluster.endpoints.extend(found.endpoints)
            cluster.spiffe_ids.extend(found.spiffe_ids)
        cluster.ClearField("slice")
    return view


def to_proto(
    policy: IdentityPolicy,
    clusters: Mapping[str, ClusterState],
    version: str = "",
    revision: int = 0,
    protos: SliceProtos | None = None,
) -> pb.View:
    """The identity's whole view (``GetView``, ``/v1/views/<identity>``)."""
    convert = protos or SliceProtos()
    slices = {
        slice_name(ref): convert(
            slice_name(ref), slice_of(clusters.get(ref.name), ref.name, ref.accounts)
        )
        for ref in policy.clusters
    }
    return assemble(policy_proto(policy, version, revision), slices)
