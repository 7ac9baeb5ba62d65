"""injector's process: what it is made of; the skeleton (trellis_runtime.service) runs it.

It serves the onboarding REST API on the admin port (proxies onboarded for their CSR, with
the admin token or a scoped onboarding token; the tokens themselves, kept in Redis as
digests), the Kubernetes mutating webhook on its own TLS port (``webhook``, supervised),
and, given a Kubernetes API, keeps the webhook configuration's caBundle current
(``ca-bundle``, supervised), and announces itself in the service registry with the identity
bootstraps expect of proxy-cp. It has no gRPC API of its own yet; the gRPC server carries
health and reflection only.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fastapi import FastAPI

from trellis_identity.onboarding import TokenStore
from trellis_injector.clients import (
    CATALOG,
    CERTMANAGER,
    CatalogClient,
    CertManagerClient,
    ServiceLocator,
    XdsLocator,
)
from trellis_injector.domain.injection import Sidecar
from trellis_injector.domain.onboarding import proxy_cp_spiffe_id
from trellis_injector.metrics import InjectorMetrics
from trellis_injector.onboarder import Onboarder
from trellis_injector.settings import InjectorSettings
from trellis_injector.sidecars import PodAgents, SidecarInjector
from trellis_injector.transport import rest, webhook
from trellis_kube import client as kube_client
from trellis_runtime import lifecycle
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

log = logging.getLogger(__name__)


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
    webhook.WebhookServer.check_name(identity, settings.webhook_service)
    components: dict[str, lifecycle.Component] = {}
    api = kube_api(settings)
    monitored = None
    if api is not None:
        # the Kubernetes client is imported only where there is an API server to talk to
        from kubernetes import client as kube

        from trellis_injector.kube import CaBundleSync
        from trellis_kube.namespaces import MonitoredNamespaces

        namespaces = MonitoredNamespaces(
            kube.CoreV1Api(api), settings.mesh_name, watch_timeout=settings.watch_timeout
        )
        components["namespaces"] = namespaces.run

        def monitored(namespace: str) -> bool | None:
            return namespaces.monitors(namespace) if namespaces.synced.is_set() else None

        sync = CaBundleSync(
            api,
            settings.webhook_configuration,
            lambda: identity.trust_bundle_pem,
            metrics,
            timeout=settings.kube_timeout,
            resync=settings.ca_bundle_resync,
        )
        identity.on_renewed(sync.renewed)
        components["ca-bundle"] = sync.run
    agents = PodAgents(
        XdsLocator(services, settings.xds_host, settings.xds_port, settings.enroll_port),
        CatalogClient(services, settings.call_timeout),
        lambda: identity.trust_bundle_pem,
        spiffe_id,
        components_dns_name(settings.proxy_cp_service_account, settings.proxy_cp_namespace),
    )
    injector = SidecarInjector(
        agents,
        sidecar(settings),
        metrics,
        failure_policy=settings.failure_policy,
        timeout=settings.webhook_timeout,
        monitored=monitored,
    )
    callers = None
    if settings.webhook_client_ca is not None:
        names = frozenset(n.strip() for n in settings.webhook_client_names.split(",") if n.strip())
        callers = webhook.CallerCheck(settings.webhook_client_ca, names)
    server = webhook.WebhookServer(
        webhook.create_app(injector, metrics, callers),
        identity,
        settings.bind_host,
        settings.webhook_port,
        callers,
    )
    components["webhook"] = server.run

    def routes(app: FastAPI) -> None:
        rest.add_routes(app, onboarding, runtime.guard, runtime.admin_token, tokens, metrics)
        webhook.add_status_route(app, server, injector, settings.webhook_configuration, api)

    return Parts(
        components=components,
        routes=routes,
        attributes={"proxy_cp_identity": spiffe_id},
    )


def sidecar(settings: InjectorSettings) -> Sidecar:
    return Sidecar(
        envoy_image=settings.envoy_image,
        init_image=settings.init_image,
        agent_image=settings.agent_image,
        mount_path=settings.proxy_mount_path,
        inbound_port=settings.sidecar_inbound_port,
        outbound_port=settings.sidecar_outbound_port,
        admin_port=settings.sidecar_admin_port,
        stats_port=settings.sidecar_stats_port,
    )


def components_dns_name(service_account: str, namespace: str) -> str:
    """The name pod agents check proxy-cp's certificate for (its Service's)."""
    return f"{service_account}.{namespace}.svc"


def kube_api(settings: InjectorSettings) -> ApiClient | None:
    """The API client, or None without a kubeconfig outside a pod (a local run: the
    webhook still answers; no caBundle is kept). A kubeconfig named but missing stops
    the service (a typo must not silently turn the caBundle upkeep off)."""
    if settings.kubeconfig is None and not kube_client.in_cluster():
        log.warning(
            "webhook.no_kubernetes reason='no kubeconfig and not in a pod' "
            "effect='patches are made, the webhook caBundle is not kept'"
        )
        return None
    return kube_client.api_client(settings.kubeconfig)


service = Service(InjectorSettings, "injector", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
