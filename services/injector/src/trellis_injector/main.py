"""injector's process: what it is made of; the skeleton (trellis_common.service) runs it.

It serves the onboarding REST API on the admin port (proxies onboarded for their CSR, with
the admin token or a scoped onboarding token; the tokens themselves, kept in Redis as
digests) and announces itself in the service
registry with the identity bootstraps expect of proxy-cp. It has no gRPC API of its own
yet; the gRPC server carries health and reflection only.
"""

from __future__ import annotations

from trellis_common.onboarding import TokenStore
from trellis_common.runtime import ServiceRuntime
from trellis_common.service import Parts, Service
from trellis_injector.clients import (
    CATALOG,
    CERTMANAGER,
    CatalogClient,
    CertManagerClient,
    ServiceLocator,
    XdsLocator,
)
from trellis_injector.domain.onboarding import proxy_cp_spiffe_id
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder
from trellis_injector.settings import InjectorSettings
from trellis_injector.transport import rest


def onboarder(settings: InjectorSettings, services: ServiceLocator, spiffe_id: str) -> Onboarder:
    return Onboarder(
        CertManagerClient(services, settings.call_timeout),
        CatalogClient(services, settings.call_timeout),
        XdsLocator(services, settings.xds_host, settings.xds_port),
        spiffe_id,
    )


async def build(runtime: ServiceRuntime, settings: InjectorSettings) -> Parts:
    # Each part was checked with the settings: a bad one never gets this far.
    spiffe_id = proxy_cp_spiffe_id(
        settings.trust_domain, settings.proxy_cp_namespace, settings.proxy_cp_service_account
    )
    identity = runtime.identity
    assert identity is not None  # joined before build
    services = ServiceLocator(
        runtime.redis,
        {CERTMANAGER: settings.certmanager_address, CATALOG: settings.catalog_address},
        settings.call_timeout,
        channel_factory=lambda address, kind: identity.channel(address, kind),
    )
    onboarding = onboarder(settings, services, spiffe_id)
    tokens = TokenStore(runtime.redis)
    metrics = InjectorMetrics(runtime.metrics)
    return Parts(
        routes=lambda app: rest.add_routes(
            app, onboarding, runtime.guard, runtime.token, tokens, metrics
        ),
        attributes={"proxy_cp_identity": spiffe_id},
    )


service = Service(InjectorSettings, "injector", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
