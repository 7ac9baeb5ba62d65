"""injector's process: wiring and lifecycle only.

Connects to Redis (waiting for it), then serves the onboarding REST API on the admin port
and announces itself in the service registry until SIGTERM. It has no gRPC API of its
own yet; the gRPC server carries health and reflection only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from trellis_common import lifecycle, logs
from trellis_common.runtime import ServiceRuntime
from trellis_common.settings import given, service_parser
from trellis_injector.clients import (
    CATALOG,
    CERTMANAGER,
    CatalogClient,
    CertManagerClient,
    ServiceLocator,
    XdsLocator,
)
from trellis_injector.domain.onboarding import proxy_cp_spiffe_id
from trellis_injector.onboarder import Onboarder
from trellis_injector.settings import InjectorSettings
from trellis_injector.transport import rest

log = logging.getLogger(__name__)


def onboarder(settings: InjectorSettings, services: ServiceLocator, spiffe_id: str) -> Onboarder:
    return Onboarder(
        CertManagerClient(services, settings.call_timeout),
        CatalogClient(services, settings.call_timeout),
        XdsLocator(services, settings.xds_host, settings.xds_port),
        spiffe_id,
    )


async def serve(settings: InjectorSettings, stop: asyncio.Event) -> None:
    # Checked before anything starts: a bad trust domain or proxy-cp identity fails here.
    spiffe_id = proxy_cp_spiffe_id(
        settings.trust_domain, settings.proxy_cp_namespace, settings.proxy_cp_service_account
    )
    runtime = await ServiceRuntime.connect(settings, "injector", stop)
    if runtime is None:
        return
    services = ServiceLocator(
        runtime.redis,
        {CERTMANAGER: settings.certmanager_address, CATALOG: settings.catalog_address},
        settings.call_timeout,
    )
    grpc_server = runtime.grpc_server([], [])
    app = runtime.admin_app({})
    rest.add_routes(app, onboarder(settings, services, spiffe_id), runtime.guard)
    await runtime.serve(stop, grpc_server, app, [], attributes={"proxy_cp_identity": spiffe_id})


def parse_args(argv: list[str] | None = None) -> dict[str, Any]:
    parser = service_parser(
        "trellis-injector",
        "Trellis injector: onboarding of proxies (Envoy bootstraps).",
        "TRELLIS_INJECTOR_",
    )
    parser.add_argument("--xds-host", help="where proxies reach proxy-cp (default: announced)")
    parser.add_argument("--xds-port", type=int, help="proxy-cp's xDS port (default: announced)")
    parser.add_argument("--certmanager-address", help="host:port; default: from the registry")
    parser.add_argument("--catalog-address", help="host:port; default: from the registry")
    parser.add_argument("--trust-domain", help="certmanager's trust domain")
    return given(parser, argv)


def main(argv: list[str] | None = None) -> int:
    settings = InjectorSettings(**parse_args(argv))
    logs.configure(settings.log_format, settings.log_level, "injector")
    return lifecycle.main(lambda stop: serve(settings, stop))


if __name__ == "__main__":
    raise SystemExit(main())
