"""catalog's process: what it is made of; the skeleton (trellis_runtime.service) runs it."""

from __future__ import annotations

import asyncio
import logging

from trellis_api import catalog_pb2_grpc
from trellis_catalog import metrics
from trellis_catalog.catalog import Catalog
from trellis_catalog.clients.certs import CertificateFollower, CertificateIssuer
from trellis_catalog.clients.providers import ProviderFollower
from trellis_catalog.settings import CatalogSettings
from trellis_catalog.sources import BothSources, DirectorySource, NoSource, Sources, SpecSource
from trellis_catalog.transport import grpc_api, rest
from trellis_kube import client as kube
from trellis_runtime.registry import REGISTRY_TOPIC
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

log = logging.getLogger(__name__)


async def first_endpoints(providers: ProviderFollower, timeout: float) -> None:
    """Hear from the providers alive now before the first views are made: a restarted
    catalog must not serve views without the endpoints it had (proxies would lose routes
    and endpoints until the providers answer). A provider that does not answer in
    ``timeout`` seconds is left to the follower (its loop shows it down)."""
    try:
        async with asyncio.timeout(timeout):
            await providers.resync(REGISTRY_TOPIC)
    except Exception as exc:  # noqa: BLE001 (views without it beat no views at all)
        log.warning("catalog.providers_not_synced timeout_s=%s error=%r", timeout, str(exc))


async def build(runtime: ServiceRuntime, settings: CatalogSettings) -> Parts:
    catalog = Catalog(
        trust_domain=settings.trust_domain,
        cluster_domain=settings.cluster_domain,
        health=runtime.health,
        freeze_heap=True,
    )
    source = spec_source(settings, catalog)
    await source.load()
    identity = runtime.identity
    assert identity is not None  # joined before build
    providers = ProviderFollower(
        catalog,
        runtime.redis,
        runtime.health,
        grace=settings.provider_grace,
        interval=settings.discovery_interval,
        channel_factory=lambda address, kind: identity.channel(address, kind),
    )
    identity.on_renewed(providers.renewed)
    await first_endpoints(providers, settings.provider_sync_timeout)
    await catalog.flush_and_announce()
    certmanager = runtime.locator("certmanager", settings.certmanager_address)
    certificates = CertificateFollower(catalog, certmanager, runtime.health.rejections)
    issuer = CertificateIssuer(catalog, certmanager, runtime.health, certificates)
    runtime.signals.follow(providers)
    runtime.signals.follow(certificates)
    metrics.register(runtime.metrics, catalog)
    servicer = grpc_api.CatalogServicer(catalog, runtime.health.rejections)
    return Parts(
        components={
            "recompute": catalog.run,
            "spec source": source.run,
            "provider sweep": providers.run,
            "certificate issuer": issuer.run,
            "proxy sweep": catalog.sweep_proxies,
        },
        grpc=[lambda s: catalog_pb2_grpc.add_CatalogServicer_to_server(servicer, s)],
        grpc_services=[grpc_api.SERVICE_NAME],
        readiness={"catalog": catalog.ready.is_set},
        routes=lambda app: rest.add_routes(app, catalog, source.describe),
    )


def spec_source(settings: CatalogSettings, catalog: Catalog) -> SpecSource:
    """The spec directory, the API server (with a kubeconfig, or in a pod), or both."""
    sources = Sources(catalog)
    parts: list[SpecSource] = []
    if settings.spec_dir:
        parts.append(
            DirectorySource(
                catalog,
                settings.spec_dir,
                rescan=settings.spec_rescan_interval,
                poll=settings.spec_poll_interval,
                sink=lambda docs, errors: sources.set("directory", docs, errors),
            )
        )
    if settings.kubeconfig is not None or kube.in_cluster():
        # the Kubernetes client is imported only where the API server is read
        from trellis_catalog.kubesource import KubeSource

        parts.append(
            KubeSource(
                kube.api_client(settings.kubeconfig),
                settings.mesh_name,
                settings.control_plane_namespace,
                catalog,
                sources,
                meshconfig_configmap=settings.meshconfig_configmap,
            )
        )
    if not parts:
        return NoSource()
    return parts[0] if len(parts) == 1 else BothSources(*parts)


service = Service(CatalogSettings, "catalog", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
