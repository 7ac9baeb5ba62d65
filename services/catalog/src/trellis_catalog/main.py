"""catalog's process: wiring and lifecycle only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from trellis_api import catalog_pb2_grpc
from trellis_catalog import metrics
from trellis_catalog.catalog import TOPIC, Catalog
from trellis_catalog.clients.certs import CertificateFollower, CertificateIssuer
from trellis_catalog.clients.providers import ProviderSet
from trellis_catalog.settings import CatalogSettings
from trellis_catalog.sources import DirectorySource, NoSource, SpecSource
from trellis_catalog.transport import grpc_api, rest
from trellis_common import lifecycle, logs
from trellis_common.registry import discover
from trellis_common.runtime import ServiceRuntime
from trellis_common.settings import given, service_parser

log = logging.getLogger(__name__)


async def find_certmanager(runtime: ServiceRuntime, settings: CatalogSettings) -> str:
    if settings.certmanager_address:
        return settings.certmanager_address
    with contextlib.suppress(Exception):  # Redis away: try again on the next round
        found = await discover(runtime.redis, "certmanager")
        return found[0].grpc_address if found else ""
    return ""


async def follow_certmanager(
    runtime: ServiceRuntime, catalog: Catalog, settings: CatalogSettings, stop: asyncio.Event
) -> None:
    """Follow certmanager at its configured address, or wherever the registry says it is;
    the followers are restarted only when that address changes."""
    address = ""
    halt = asyncio.Event()
    task: asyncio.Task[None] | None = None
    try:
        while not stop.is_set():
            found = await find_certmanager(runtime, settings)
            if found and found != address:
                if task is not None:
                    log.info("certmanager.moved address=%s", found)
                    halt.set()
                    await task
                address, halt = found, asyncio.Event()
                follower = CertificateFollower(catalog, address, runtime.health)
                issuer = CertificateIssuer(catalog, address, runtime.health, follower)
                task = asyncio.create_task(
                    lifecycle.run_components([follower.run, issuer.run], halt)
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settings.discovery_interval)
    finally:
        halt.set()
        if task is not None:
            await task


async def serve(settings: CatalogSettings, stop: asyncio.Event) -> None:
    runtime = await ServiceRuntime.connect(settings, "catalog", stop)
    if runtime is None:
        return
    publisher = runtime.publisher

    async def announce(kind: str, key: str) -> int:
        return (await publisher.publish(TOPIC, kind, key)).revision

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
    providers = ProviderSet(
        catalog,
        runtime.redis,
        runtime.health,
        settings.discovery_interval,
        settings.provider_grace,
    )

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
            "providers": providers.run,
            "certmanager": lambda s: follow_certmanager(runtime, catalog, settings, s),
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
