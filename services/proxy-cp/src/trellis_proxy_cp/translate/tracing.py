"""Tracing: MeshConfig ``observability.tracing`` as Envoy's Zipkin tracer (pure).

When the view's mesh settings carry a collector, every HTTP connection manager of the proxy
(outbound and inbound) traces with ``envoy.tracers.zipkin``, Zipkin v2 JSON to
``<address>:<port><endpoint>`` through the cluster ``trellis-tracing``, and tags each span
with the proxy's service (``<namespace>/<service>``) and the direction, as OSM's sidecars
do. Without a collector nothing is traced and no cluster is made.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.trace.v3 import http_tracer_pb2, zipkin_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm,
)
from envoy.type.tracing.v3 import custom_tag_pb2

from trellis_api import catalog_pb2
from trellis_proxy_cp.translate.common import one_endpoint, pack, seconds

CLUSTER = "trellis-tracing"


def collector(view: catalog_pb2.View) -> catalog_pb2.Tracing | None:
    return view.mesh.tracing if view.mesh.HasField("tracing") else None


def tracing(view: catalog_pb2.View, direction: str) -> hcm.HttpConnectionManager.Tracing | None:
    """The connection manager's tracing for ``direction`` (outbound, inbound), or None."""
    found = collector(view)
    if found is None:
        return None
    zipkin = zipkin_pb2.ZipkinConfig(
        collector_cluster=CLUSTER,
        collector_endpoint=found.endpoint,
        collector_endpoint_version=zipkin_pb2.ZipkinConfig.HTTP_JSON,
        collector_hostname=found.address,
    )
    tags = {"service": f"{view.namespace}/{view.service}", "direction": direction}
    return hcm.HttpConnectionManager.Tracing(
        provider=http_tracer_pb2.Tracing.Http(
            name="envoy.tracers.zipkin", typed_config=pack(zipkin)
        ),
        custom_tags=[
            custom_tag_pb2.CustomTag(tag=tag, literal=custom_tag_pb2.CustomTag.Literal(value=value))
            for tag, value in sorted(tags.items())
        ],
    )


def cluster(view: catalog_pb2.View) -> cluster_pb2.Cluster | None:
    """The collector's cluster (plain HTTP, resolved by DNS), or None."""
    found = collector(view)
    if found is None:
        return None
    return cluster_pb2.Cluster(
        name=CLUSTER,
        type=cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=seconds(1.0),
        load_assignment=one_endpoint(CLUSTER, found.address, found.port),
    )
