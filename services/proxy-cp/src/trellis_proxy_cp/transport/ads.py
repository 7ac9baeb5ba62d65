"""The Aggregated Discovery Service: both ADS methods on one servicer.

gRPC registers one servicer per service, and ``AggregatedDiscoveryService`` has two methods:
state of the world (:mod:`.ads_sotw`) and delta (:mod:`.ads_delta`). They share one
:class:`~.streams.StreamRunner` (snapshot source, authorizer, hooks, stream registry), so the
admin API sees the streams of both protocols in one registry.
"""

from __future__ import annotations

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf.message import Message

from trellis_proxy_cp.cache.store import SnapshotSource
from trellis_proxy_cp.transport.ads_delta import DeltaServer
from trellis_proxy_cp.transport.ads_sotw import SotwServer
from trellis_proxy_cp.transport.limits import StreamLimits
from trellis_proxy_cp.transport.streamhooks import NoHooks, StreamHooks
from trellis_proxy_cp.transport.streams import Authorizer, StreamRegistry, StreamRunner
from trellis_runtime.grpcserver import serialized_as_is

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"


class AdsServicer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):  # type: ignore[misc]
    """``StreamAggregatedResources`` and ``DeltaAggregatedResources`` for one cache."""

    def __init__(
        self,
        source: SnapshotSource,
        authorizer: Authorizer,
        hooks: StreamHooks | None = None,
        registry: StreamRegistry | None = None,
        queue_size: int = 64,
        stream_limits: StreamLimits | None = None,
    ) -> None:
        self.registry = registry if registry is not None else StreamRegistry()
        self.runner = StreamRunner(
            source,
            authorizer,
            hooks if hooks is not None else NoHooks(),
            self.registry,
            queue_size,
            stream_limits,
        )
        sotw, delta = SotwServer(self.runner), DeltaServer(self.runner)
        self.StreamAggregatedResources = sotw.StreamAggregatedResources
        self.DeltaAggregatedResources = delta.DeltaAggregatedResources

    def register(self, server: grpc.aio.Server) -> None:
        """Add this servicer to ``server`` (a ``trellis_runtime.grpcserver`` registration):
        as the generated code does, except that a response may also be bytes, already
        serialized (the state-of-the-world streams share a type's serialized response,
        :meth:`~trellis_proxy_cp.cache.snapshot.Snapshot.response`)."""
        handlers = {
            "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self.StreamAggregatedResources,
                request_deserializer=discovery_pb2.DiscoveryRequest.FromString,
                response_serializer=_serialized,
            ),
            "DeltaAggregatedResources": grpc.stream_stream_rpc_method_handler(
                self.DeltaAggregatedResources,
                request_deserializer=discovery_pb2.DeltaDiscoveryRequest.FromString,
                response_serializer=_serialized,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        server.add_registered_method_handlers(SERVICE, handlers)


#: a response may be bytes, serialized already (the rule every GrpcServer's streams follow)
_serialized = serialized_as_is(Message.SerializeToString)
