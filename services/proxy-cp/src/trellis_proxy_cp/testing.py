"""Test helpers for the xDS core: small valid Envoy resources, hooks that record, a fake
authorizer and a real ADS server with a real grpcio client.

The resources are the smallest Envoy accepts that still have the edges the consistency check
follows: an EDS cluster (``eds_cluster_config`` over ADS) with its ClusterLoadAssignment, a
listener whose HttpConnectionManager fetches its RouteConfiguration over RDS, SDS secrets
named by TLS contexts.

:class:`AdsClient` drives one stream the way Envoy does. Every wait is bounded (2 s) so a bug
fails a test instead of hanging it, and :meth:`AdsClient.quiet` proves that *nothing* was
sent without sleeping: it sends a request for a type the stream never asked for, which the
server always answers, and checks that this answer is the next message (the server handles a
stream's requests in order and sends in order).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import grpc
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
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from trellis_api import catalog_pb2
from trellis_common.ids import ProxyCommonName
from trellis_proxy_cp.cache.snapshot import Resource, Snapshot, make_resource
from trellis_proxy_cp.cache.store import SnapshotCache, SnapshotSource
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_proxy_cp.transport.ads import AdsServicer
from trellis_proxy_cp.transport.limits import StreamLimits
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused, StreamRegistry
from trellis_proxy_cp.types import CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, TypeUrl

TIMEOUT = 2.0
_PREFIX = "type.googleapis.com/"


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
        items += [cluster(f"c{i}", cert="cert", ca="ca"), load_assignment(f"c{i}", *ports)]
    items += [listener("l0", "r0", cert="cert"), route_config("r0", "c0")]
    items += [secret("cert"), secret("ca")]
    return snapshot(version, *items)


@dataclasses.dataclass
class RecordingHooks:
    """Hooks that record every call as ``(hook, proxy_id, type_url, version[, message])``;
    refusals as ``("refused", proxy_id, protocol, code, reason)``."""

    calls: list[tuple[str, ...]] = dataclasses.field(default_factory=list)

    def on_refused(self, proxy_id: str, protocol: str, refused: StreamRefused) -> None:
        self.calls.append(("refused", proxy_id, protocol, refused.code.name, refused.reason))

    def on_open(self, stream: ProxyStream) -> None:
        self.calls.append(("open", stream.proxy_id))

    def on_close(self, stream: ProxyStream) -> None:
        self.calls.append(("close", stream.proxy_id))

    def on_sent(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self.calls.append(("sent", stream.proxy_id, type_url, version))

    def on_ack(self, stream: ProxyStream, type_url: TypeUrl, version: str) -> None:
        self.calls.append(("ack", stream.proxy_id, type_url, version))

    def on_nack(
        self, stream: ProxyStream, type_url: TypeUrl, version: str, error_message: str
    ) -> None:
        self.calls.append(("nack", stream.proxy_id, type_url, version, error_message))

    def of(self, hook: str) -> list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] == hook and not _is_probe(c)]


def _is_probe(call: tuple[str, ...]) -> bool:
    return len(call) > 2 and call[2].startswith(PROBE_PREFIX)


class StaticAuthorizer:
    """Proxy id = node id; key from ``keys`` (else ``default_key``); ``refuse`` by node id."""

    def __init__(
        self,
        keys: Mapping[str, str] | None = None,
        default_key: str = "mesh",
        refuse: Mapping[str, tuple[grpc.StatusCode, str]] | None = None,
    ) -> None:
        self.keys = dict(keys or {})
        self.default_key = default_key
        self.refuse = dict(refuse or {})

    async def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], node: Any
    ) -> ProxyStream:
        if node.id in self.refuse:
            code, message = self.refuse[node.id]
            raise StreamRefused(code, message)
        key = self.keys.get(node.id, self.default_key)
        return ProxyStream(proxy_id=node.id, key=key, node_id=node.id, identity=f"id-{node.id}")


PROBE_PREFIX = _PREFIX + "trellis.test.Probe"
_probes = itertools.count()


class AdsClient:
    """One ADS stream (SotW or delta) driven by hand, with bounded waits."""

    def __init__(self, call: Any, delta: bool) -> None:
        self.call = call
        self.delta = delta
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for response in self.call:
                await self._inbox.put(response)
        except grpc.aio.AioRpcError as error:
            await self._inbox.put(error)
        await self._inbox.put(None)

    async def send(self, **fields: Any) -> None:
        message = (
            discovery_pb2.DeltaDiscoveryRequest(**fields)
            if self.delta
            else discovery_pb2.DiscoveryRequest(**fields)
        )
        await asyncio.wait_for(self.call.write(message), TIMEOUT)

    async def ack(self, response: Any, names: list[str] | None = None) -> None:
        """ACK ``response`` like Envoy (SotW: with its version and the given names)."""
        if self.delta:
            await self.send(type_url=response.type_url, response_nonce=response.nonce)
        else:
            await self.send(
                type_url=response.type_url,
                version_info=response.version_info,
                response_nonce=response.nonce,
                resource_names=names or [],
            )

    async def nack(
        self, response: Any, message: str, accepted: str = "", names: list[str] | None = None
    ) -> None:
        """NACK ``response`` (SotW: ``accepted`` is the last version the proxy accepted)."""
        error = {"code": 13, "message": message}  # a google.rpc.Status
        if self.delta:
            await self.send(
                type_url=response.type_url, response_nonce=response.nonce, error_detail=error
            )
        else:
            await self.send(
                type_url=response.type_url,
                version_info=accepted,
                response_nonce=response.nonce,
                resource_names=names or [],
                error_detail=error,
            )

    async def recv(self, timeout: float = TIMEOUT) -> Any:
        """The next response; fails on the end of the stream or after ``timeout``."""
        item = await asyncio.wait_for(self._inbox.get(), timeout)
        if item is None or isinstance(item, grpc.aio.AioRpcError):
            raise AssertionError(f"stream ended: {item!r}")
        return item

    async def status(self) -> grpc.StatusCode:
        """Wait for the end of the stream and return its status code."""
        while True:
            item = await asyncio.wait_for(self._inbox.get(), TIMEOUT)
            if isinstance(item, grpc.aio.AioRpcError):
                return item.code()
            if item is None:
                return await asyncio.wait_for(self.call.code(), TIMEOUT)

    async def details(self) -> str:
        return str(await asyncio.wait_for(self.call.details(), TIMEOUT))

    async def quiet(self) -> None:
        """Assert that nothing was sent since the last :meth:`recv` (see module docstring)."""
        type_url = f"{PROBE_PREFIX}{next(_probes)}"
        await self.send(type_url=type_url)
        response = await self.recv()
        assert response.type_url == type_url, f"unexpected response: {response}"

    async def close(self) -> None:
        await self.call.done_writing()
        self._reader.cancel()
        self.call.cancel()


def names_of(response: Any) -> list[str]:
    """Resource names of a SotW or delta response, in order."""
    if isinstance(response, discovery_pb2.DeltaDiscoveryResponse):
        return [r.name for r in response.resources]
    out = []
    for packed in response.resources:
        kind = _MESSAGES[TypeUrl(packed.type_url)]()
        packed.Unpack(kind)
        out.append(kind.cluster_name if packed.type_url == ENDPOINT else kind.name)
    return out


_MESSAGES: dict[TypeUrl, Any] = {
    CLUSTER: cluster_pb2.Cluster,
    ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    LISTENER: listener_pb2.Listener,
    ROUTE: route_pb2.RouteConfiguration,
    SECRET: secret_pb2.Secret,
}


@dataclasses.dataclass
class AdsHarness:
    """A real grpc.aio server with :class:`AdsServicer` on 127.0.0.1 and a channel to it."""

    servicer: AdsServicer
    channel: grpc.aio.Channel
    clients: list[AdsClient] = dataclasses.field(default_factory=list)

    async def open(self, *, delta: bool = False) -> AdsClient:
        """Open a stream; the first :meth:`AdsClient.send` should carry ``node=node(...)``."""
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel)
        call = stub.DeltaAggregatedResources() if delta else stub.StreamAggregatedResources()
        client = AdsClient(call, delta)
        self.clients.append(client)
        return client


def node(node_id: str = "envoy-1") -> base_pb2.Node:
    return base_pb2.Node(id=node_id, cluster="test")


@asynccontextmanager
async def ads_server(
    source: SnapshotSource,
    *,
    authorizer: Any = None,
    hooks: Any = None,
    queue_size: int = 64,
    stream_limits: StreamLimits | None = None,
) -> AsyncIterator[AdsHarness]:
    """Serve ADS for ``source`` on a free port; close every client and the server after."""
    servicer = AdsServicer(
        source,
        authorizer or StaticAuthorizer(),
        hooks=hooks,
        queue_size=queue_size,
        stream_limits=stream_limits,
    )
    server = grpc.aio.server()
    servicer.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    harness = AdsHarness(servicer, channel)
    try:
        yield harness
    finally:
        for client in harness.clients:
            client._reader.cancel()
            client.call.cancel()
        await channel.close()
        await server.stop(None)
        # Let grpc's per-RPC tasks see their handlers end before the loop closes.
        for _ in range(3):
            await asyncio.sleep(0)


# -- a control plane with inputs and connected proxies (core, admin API, the CLI's tests) ----
#
# The catalog and certmanager as :class:`~trellis_proxy_cp.core.ProxyControlPlane` sees them
# (two fetch functions, ``forget`` and ``on_refused``), recording every call; views that
# translate to a consistent snapshot; and proxies connected the way the authorizer and the
# ADS server connect them, without a gRPC stream.

KEY_PEM = (
    b"-----BEGIN PRIVATE KEY-----\n"
    b"VFJFTExJUy1URVNULUtFWS1USEFULU1VU1QtTkVWRVItQkUtU0hPV04=\n"
    b"-----END PRIVATE KEY-----\n"
)
"""A private key that the admin API must never show (nor its base64)."""

SPIFFE_PREFIX = "spiffe://cluster.local/ns/"


def proxy_common_name(service: str, namespace: str, number: int = 1) -> str:
    """A proxy certificate's common name ``<uuid>.<service>.<namespace>``, stable per number."""
    return f"00000000-0000-4000-8000-{number:012d}.{service}.{namespace}"


def view(
    identity: str = "bookstore/bookstore",
    version: str = "1",
    *,
    upstream: str = "bookstore/reviews",
    upstream_port: int = 9080,
    endpoints: tuple[str, ...] = ("10.0.0.1",),
    discovery: str = "STATIC",
) -> catalog_pb2.View:
    """A catalog view that translates to a consistent snapshot: an HTTP inbound port any mesh
    identity may call, and one HTTP upstream with its cluster."""
    pb = catalog_pb2
    namespace, service = identity.split("/")
    up_namespace, up_service = upstream.split("/")
    cluster_name = f"{upstream}|{upstream_port}"
    up_spiffe = f"{SPIFFE_PREFIX}{up_namespace}/sa/{up_service}"
    return pb.View(
        identity=identity,
        namespace=namespace,
        service=service,
        service_account=service,
        spiffe_id=f"{SPIFFE_PREFIX}{namespace}/sa/{service}",
        version=version,
        outbound=[
            pb.OutboundService(
                namespace=up_namespace,
                name=up_service,
                port=upstream_port,
                protocol="http",
                hostnames=[up_service, f"{up_service}.{up_namespace}"],
                routes=[
                    pb.Route(
                        name="default",
                        match=pb.HttpMatch(path_regex=".*"),
                        clusters=[pb.WeightedCluster(cluster=cluster_name, weight=100)],
                    )
                ],
                spiffe_ids=[up_spiffe],
            )
        ],
        inbound=[
            pb.InboundPort(
                port=14001, target_port=8080, protocol="http", name="http", allow_any=True
            )
        ],
        clusters=[
            pb.Cluster(
                name=cluster_name,
                namespace=up_namespace,
                service=up_service,
                port=upstream_port,
                protocol="http",
                discovery=discovery,
                endpoints=[
                    pb.ClusterEndpoint(address=address, port=upstream_port, weight=1)
                    for address in endpoints
                ],
                spiffe_ids=[up_spiffe],
                mesh_tls=True,
            )
        ],
    )


def material(serial: str = "s1", key_pem: bytes = KEY_PEM) -> SecretMaterial:
    """Secret material whose contents are not validated."""
    return SecretMaterial(
        cert_chain_pem=b"-----BEGIN CERTIFICATE-----\nCERT\n-----END CERTIFICATE-----\n",
        key_pem=key_pem,
        trust_bundle_pem=b"-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
        serial=serial,
    )


@dataclasses.dataclass
class FakeSources:
    """The catalog and certmanager behind a control plane: fetches answer from ``views`` and
    ``materials`` (else :func:`view` and :func:`material`), and every call is recorded."""

    views: dict[str, catalog_pb2.View] = dataclasses.field(default_factory=dict)
    materials: dict[str, SecretMaterial] = dataclasses.field(default_factory=dict)
    view_fetches: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    material_fetches: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    forgotten: list[str] = dataclasses.field(default_factory=list)
    refused: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)
    failure: Exception | None = None
    """Raised by the next fetch (then cleared), as a catalog that is down would."""

    async def fetch_view(self, identity: str, service_account: str) -> catalog_pb2.View:
        self.view_fetches.append((identity, service_account))
        await asyncio.sleep(0)
        self._fail()
        return self.views.get(identity) or view(identity)

    async def fetch_material(self, identity: str, service_account: str) -> SecretMaterial:
        self.material_fetches.append((identity, service_account))
        await asyncio.sleep(0)
        self._fail()
        return self.materials.get(identity) or material()

    def _fail(self) -> None:
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    def forget(self, identity: str) -> None:
        self.forgotten.append(identity)

    def on_refused(self, key: str, problems: list[str]) -> None:
        self.refused.append((key, problems))

    def control_plane(self, cache: SnapshotCache) -> ProxyControlPlane:
        """A control plane over ``cache`` fed by these fakes."""
        return ProxyControlPlane(
            cache, self.fetch_view, self.fetch_material, self.forget, self.on_refused
        )


async def connect(
    control_plane: ProxyControlPlane,
    streams: StreamRegistry,
    common_name: str,
    *,
    settings: ProxySettings | None = None,
    protocol: str = "sotw",
    envoy_version: tuple[int, int, int] = (1, 40, 0),
) -> ProxyStream:
    """Attach a proxy as :class:`~trellis_proxy_cp.authorizer.MeshAuthorizer` does and add its
    stream to ``streams`` as the ADS server does; nothing is sent yet."""
    proxy = ProxyCommonName.parse(common_name)
    identity = f"{proxy.namespace}/{proxy.service}"
    key = await control_plane.attach(
        common_name, identity, proxy.service, settings or ProxySettings()
    )
    major, minor, patch = envoy_version
    node = base_pb2.Node(id=common_name, cluster=proxy.service, user_agent_name="envoy")
    build = node.user_agent_build_version.version
    build.major_number, build.minor_number, build.patch = major, minor, patch
    stream = ProxyStream(
        proxy_id=common_name,
        key=key,
        node_id=common_name,
        identity=identity,
        node=node,
        protocol=protocol,
    )
    streams.add(stream)
    return stream


def acknowledge(stream: ProxyStream, current: Snapshot) -> None:
    """Record every type of ``current`` as sent to and ACKed by ``stream`` (a clean push)."""
    for type_url in current.type_urls():
        state = stream.state(type_url)
        state.sent_version = state.acked_version = current.version_of(type_url)
        state.nonce = "1"


def reject(stream: ProxyStream, type_url: TypeUrl, version: str, message: str) -> None:
    """Record that ``stream`` was sent ``version`` of ``type_url`` and NACKed it."""
    state = stream.state(type_url)
    state.sent_version = version
    state.nack_count += 1
    state.last_error = message


def broken_view(identity: str = "bookstore/bookstore", version: str = "1") -> catalog_pb2.View:
    """A view proxy-cp must refuse: it names the same cluster twice."""
    found = view(identity, version)
    found.clusters.append(found.clusters[0])
    return found


# -- the catalog's ListProxies, served over real gRPC; a fake clock -------------------------


class FakeCatalog:
    """The catalog's ``ListProxies`` on a real grpc.aio server (see :func:`fake_catalog`):
    lists ``expected`` (common name -> service account) and counts ``calls``. While ``gate``
    is set to an unset event, answers wait for it; with ``failing``, calls fail UNAVAILABLE."""

    def __init__(self, expected: Mapping[str, str] | None = None) -> None:
        self.expected = dict(expected or {})
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.failing = False
        self.address = ""

    async def ListProxies(
        self, request: catalog_pb2.ListProxiesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> catalog_pb2.ListProxiesResponse:
        self.calls += 1
        listed = catalog_pb2.ListProxiesResponse(
            proxies=[
                catalog_pb2.ProxyStatus(common_name=name, service_account=account, expected=True)
                for name, account in self.expected.items()
            ]
            + [catalog_pb2.ProxyStatus(common_name="connected-only.x.y", expected=False)]
        )
        if self.gate is not None:
            await self.gate.wait()
        if self.failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "catalog is restarting")
        return listed

    def register(self, server: grpc.aio.Server) -> None:
        handler = grpc.unary_unary_rpc_method_handler(
            self.ListProxies,
            request_deserializer=catalog_pb2.ListProxiesRequest.FromString,
            response_serializer=catalog_pb2.ListProxiesResponse.SerializeToString,
        )
        service = catalog_pb2.DESCRIPTOR.services_by_name["Catalog"].full_name
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, {"ListProxies": handler}),)
        )


@asynccontextmanager
async def fake_catalog(expected: Mapping[str, str] | None = None) -> AsyncIterator[FakeCatalog]:
    """A :class:`FakeCatalog` serving on a free port of 127.0.0.1 (``address``)."""
    catalog = FakeCatalog(expected)
    server = grpc.aio.server()
    catalog.register(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    catalog.address = f"127.0.0.1:{port}"
    try:
        yield catalog
    finally:
        if catalog.gate is not None:
            catalog.gate.set()
        await server.stop(None)


class FakeClock:
    """A monotonic clock that moves only when told to, or when something sleeps on it."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)
