"""proxy-cp's process: what it is made of; the skeleton (trellis_runtime.service) runs it.

Finds the catalog and certmanager through locators (settings, else the service registry),
then serves ADS (state of the world and delta, mTLS required), proxy certificate renewal on
the same port (``renewal.py``), pod agents' enrollment on its own server-TLS port
(``enrollment.py``) and the admin REST API. Every port it serves presents its component
certificate (the one it joined with, renewed in place: ``runtime.identity``), so the
identity that ``trellis identity revoke proxy-cp`` revokes is the one proxies see;
certmanager issues no service certificate in the control plane's namespace. The catalog's
resources are watched on one stream (``WatchChanges``, the component ``catalog follower``:
``clients/catalog.py``), certmanager's certificates followed on the runtime's signals hub
(``clients/certs.py``).
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from fastapi import FastAPI

from trellis_proxy_cp.authorizer import MeshAuthorizer, end_revoked
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.clients.catalog import CatalogClient
from trellis_proxy_cp.clients.certs import CertClient
from trellis_proxy_cp.clients.destinations import DestinationTable
from trellis_proxy_cp.clients.expected import ExpectationTiming
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.discovery import rest as discovery_rest
from trellis_proxy_cp.discovery.access import Access, CallerViews, identified
from trellis_proxy_cp.discovery.server import (
    CONDUIT_SERVICE,
    LINKERD_SERVICE,
    Discovery,
    DiscoveryMetrics,
    DiscoveryOptions,
)
from trellis_proxy_cp.discovery.server import register as register_discovery
from trellis_proxy_cp.enrollment import SERVICE_NAME as ENROLLMENT_SERVICE
from trellis_proxy_cp.enrollment import EnrollmentServicer
from trellis_proxy_cp.hooks import ProxyHooks
from trellis_proxy_cp.metrics import XdsMetrics
from trellis_proxy_cp.renewal import SERVICE_NAME as RENEWAL_SERVICE
from trellis_proxy_cp.renewal import ProxyCertificatesServicer
from trellis_proxy_cp.settings import ProxyCpSettings
from trellis_proxy_cp.translate.linkerd import RetryBudget
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.transport import rest
from trellis_proxy_cp.transport.ads import SERVICE as ADS_SERVICE
from trellis_proxy_cp.transport.ads import AdsServicer
from trellis_proxy_cp.transport.limits import StreamLimits
from trellis_proxy_cp.transport.streams import StreamRegistry
from trellis_runtime.grpcserver import DEFAULT_OPTIONS, GrpcServer
from trellis_runtime.lifecycle import freeze_startup_heap
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

log = logging.getLogger(__name__)

# When thousands of Envoys reconnect at once (proxy-cp restarted), gRPC's core queues the
# new streams the server has not picked up yet; past ~1,000 it refuses them ("Too many
# pending requests"). bench/xds measured the storm; these let it through.
XDS_OPTIONS = (
    *DEFAULT_OPTIONS,
    ("grpc.server.max_pending_requests", 20_000),
    ("grpc.server.max_pending_requests_hard_limit", 40_000),
)


def tune_garbage_collection() -> None:
    """Thousands of long-lived stream objects make the default collector rescan them on
    every push; freezing what start-up made (called once it is all made, before serving;
    its garbage collected first, so none is kept for good) and raising the first threshold
    cut push CPU by about a third in bench/xds."""
    freeze_startup_heap()
    gc.set_threshold(50_000, 20, 100)


async def build(runtime: ServiceRuntime, settings: ProxyCpSettings) -> Parts | None:
    # Every port serves the component's certificate, whichever replica serves it: clients
    # check one name and SPIFFE id (proxy-cp.trellis-system..., .../sa/proxy-cp), as for a
    # Kubernetes Service's pods; a renewal reaches the next handshake.
    own = runtime.identity
    assert own is not None  # joined before build
    cache = SnapshotCache()
    metrics = XdsMetrics(runtime.metrics)

    control_plane: ProxyControlPlane
    servicer: AdsServicer
    caller_views: CallerViews  # of Destination API callers; shares the catalog's follower

    def xds_follows(identity: str) -> bool:
        return control_plane.follows(identity)

    async def on_resources(policies: dict[str, Any], slices: dict[str, Any]) -> None:
        for identity, policy in policies.items():
            caller_views.set(identity, policy)
        followed = {i: p for i, p in policies.items() if xds_follows(i)}
        await control_plane.apply(followed, slices)

    async def on_material(identity: str, material: SecretMaterial) -> None:
        await control_plane.set_material(identity, material)

    table = DestinationTable()
    expectation = ExpectationTiming(
        settings.expected_min_interval, settings.expected_max_age, settings.expected_refused_for
    )
    catalog = CatalogClient(
        runtime.locator("catalog", settings.catalog_address),
        on_resources,
        settings.instance_name,
        runtime.health,
        expectation,
        table,
    )

    def on_revoked(common_name: str, serials: set[str]) -> None:
        catalog.expectations.revoked(common_name)
        end_revoked(servicer.runner, common_name, serials)

    revoked = RevokedSerials()
    certs = CertClient(
        runtime.locator("certmanager", settings.certmanager_address),
        on_material,
        runtime.health,
        catalog.expectations.learned,
        on_revoked,
        revoked,
    )
    catalog.expectations.ask_issuer = certs.issued
    runtime.signals.follow(certs.follower)

    def forget(identity: str) -> None:
        certs.forget(identity)
        if identity not in caller_views:  # else Destination streams still follow its view
            catalog.forget(identity)

    def forget_caller(identity: str) -> None:
        if not xds_follows(identity):
            catalog.forget(identity)

    async def want_policy(identity: str, service_account: str) -> Any:
        return (await catalog.want(identity, service_account)).policy

    caller_views = CallerViews(want_policy, forget_caller)

    control_plane = ProxyControlPlane(
        cache,
        catalog.want,
        certs.want,
        forget,
        on_refused=lambda key, problems: metrics.refused_snapshots.inc(),
        on_built=metrics.translated,
    )
    streams = StreamRegistry()
    hooks = ProxyHooks(
        control_plane, metrics, catalog.register, catalog.unregister, runtime.health.rejections
    )
    stream_limits = StreamLimits(
        max_node_metadata_bytes=settings.max_node_metadata_bytes,
        max_resource_names=settings.max_resource_names,
        max_resource_name_bytes=settings.max_resource_name_bytes,
        max_streams_per_proxy=settings.max_streams_per_proxy,
    )
    authorizer = MeshAuthorizer(control_plane, catalog.expected, revoked)
    servicer = AdsServicer(
        cache,
        authorizer,
        hooks,
        registry=streams,
        stream_limits=stream_limits,
    )
    renewal = ProxyCertificatesServicer(authorizer.identify, certs.renew_proxy, metrics.renewals)
    xds = GrpcServer(
        f"{settings.xds_host}:{settings.grpc_port}",
        [
            servicer.register,
            renewal.register,
        ],
        [ADS_SERVICE, RENEWAL_SERVICE],
        credentials=own.server_credentials(),
        options=XDS_OPTIONS,
        reflection=settings.debug_endpoints,
    )
    discovery = Discovery(
        table,
        DiscoveryOptions(
            cluster_domain=settings.cluster_domain,
            queue_capacity=settings.destination_queue_capacity,
            update_interval=settings.destination_update_interval,
            budget=RetryBudget(
                settings.retry_budget_ratio,
                settings.retry_budget_min_per_second,
                settings.retry_budget_ttl,
            ),
        ),
        DiscoveryMetrics(metrics.make),
        Access(identified(authorizer.identify), caller_views, catalog.follower.fresh),
        runtime.health.rejections,
    )
    components = {"catalog follower": catalog.follower.run}
    attributes = {}
    if settings.enroll_port >= 0:
        enrollment = EnrollmentServicer(certs.enroll, catalog.expect, metrics.enrollments)
        enroll_server = GrpcServer(
            f"{settings.xds_host}:{settings.enroll_port}",
            [enrollment.register],
            [ENROLLMENT_SERVICE],
            credentials=own.server_credentials(require_client_auth=False),
            reflection=settings.debug_endpoints,
        )
        port = await enroll_server.start()
        components["enrollment"] = enroll_server.run
        attributes["enroll_port"] = str(port)
    if settings.destination_port >= 0:
        destination_server = GrpcServer(
            f"{settings.xds_host}:{settings.destination_port}",
            register_discovery(discovery),
            [LINKERD_SERVICE, CONDUIT_SERVICE],
            credentials=own.server_credentials(),
            reflection=settings.debug_endpoints,
        )
        port = await destination_server.start()
        components["destination"] = destination_server.run
        attributes["destination_port"] = str(port)

    def routes(app: FastAPI) -> None:
        rest.add_routes(app, streams, cache, control_plane)
        discovery_rest.add_routes(app, discovery, runtime.guard)

    tune_garbage_collection()
    return Parts(
        components=components,
        grpc_server=xds,
        readiness={
            "catalog": catalog.connected.is_set,
            "certmanager": certs.connected.is_set,
        },
        routes=routes,
        attributes=attributes,
    )


service = Service(ProxyCpSettings, "proxy-cp", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
