"""catalog's process: wiring and lifecycle only."""

from __future__ import annotations

import asyncio
from typing import Any

from trellis_api import catalog_pb2_grpc
from trellis_catalog import metrics
from trellis_catalog.catalog import TOPIC, Catalog
from trellis_catalog.clients.certs import CertificateFollower, CertificateIssuer
from trellis_catalog.clients.providers import ProviderFollower
from trellis_catalog.settings import CatalogSettings
from trellis_catalog.sources import DirectorySource, NoSource, SpecSource
from trellis_catalog.transport import grpc_api, rest
from trellis_common import lifecycle, logs
from trellis_common.runtime import ServiceRuntime
from trellis_common.settings import given, service_parser


async def serve(settings: CatalogSettings, stop: asyncio.Event) -> None:
    runtime = await ServiceRuntime.connect(settings, "catalog", stop)
    if runtime is None:
        return
    outbox = runtime.outbox

    async def announce(kind: str, key: str) -> int:
        return await outbox.signal(TOPIC, kind, key)

    catalog = Catalog(
        announce,
        trust_domain=settings.trust_domain,
        cluster_domain=settings.cluster_domain,
        quiet=settings.debounce_quiet,
        max_delay=settings.debounce_max,
        health=runtime.health,
    )
    source: SpecSource = (
        DirectorySource(
            catalog,
            settings.spec_dir,
            rescan=settings.spec_rescan_interval,
            poll=settings.spec_poll_interval,
        )
        if settings.spec_dir
        else NoSource()
    )
    await source.load()
    await catalog.flush_and_announce()
    providers = ProviderFollower(
        catalog,
        runtime.redis,
        runtime.health,
        grace=settings.provider_grace,
        interval=settings.discovery_interval,
    )
    certmanager = runtime.locator("certmanager", settings.certmanager_address)
    certificates = CertificateFollower(catalog, certmanager, runtime.health.rejections)
    issuer = CertificateIssuer(catalog, certmanager, runtime.health, certificates)
    runtime.signals.follow(providers)
    runtime.signals.follow(certificates)

    servicer = grpc_api.CatalogServicer(catalog, runtime.health.rejections)
    grpc_server = runtime.grpc_server(
        [lambda s: catalog_pb2_grpc.add_CatalogServicer_to_server(servicer, s)],
        [grpc_api.SERVICE_NAME],
    )
    metrics.register(runtime.metrics, catalog)
    app = runtime.admin_app({"catalog": catalog.ready.is_set})
    rest.add_routes(app, catalog, source.describe)
    await runtime.serve(
        stop,
        grpc_server,
        app,
        {
            "recompute": catalog.run,
            "spec source": source.run,
            "provider sweep": providers.run,
            "certificate issuer": issuer.run,
        },
    )


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    parser = service_parser(
        "trellis-catalog",
        "Trellis catalog: the mesh specification and per-identity views.",
        "TRELLIS_CATALOG_",
    )
    parser.add_argument("--spec-dir", help="directory of mesh documents (YAML), watched")
    parser.add_argument("--certmanager-address", help="host:port; default: from the registry")
    return given(parser, argv)


def main(argv: list[str] | None = None) -> int:
    settings = CatalogSettings(**parse_args(argv))
    logs.configure(settings.log_format, settings.log_level, "catalog")
    return lifecycle.main(lambda stop: serve(settings, stop))


if __name__ == "__main__":
    raise SystemExit(main())
