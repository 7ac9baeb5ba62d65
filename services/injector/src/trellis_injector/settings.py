"""injector settings: flags, ``TRELLIS_INJECTOR_*`` (plus the shared ``TRELLIS_*`` ones).

The injector finds certmanager, the catalog and proxy-cp in the service registry unless
told where they are. ``xds_host``/``xds_port`` are what goes into bootstraps: the address
proxies dial, which is not always the one proxy-cp announces (a VM elsewhere needs a name
or address it can reach, not 127.0.0.1). Each can be set alone; the other half then comes
from the registry.

proxy-cp's identity, which bootstraps verify its serving certificate against, is
``spiffe://<trust_domain>/ns/<proxy_cp_namespace>/sa/<proxy_cp_service_account>``; each
part is checked here, so a bad one stops the service before it starts, naming the setting.

The mutating webhook listens on ``webhook_port`` (9443; 0 picks a free port, for tests)
with the injector's component certificate, which must name ``webhook_service`` (the
API server dials ``<service>.<namespace>.svc``; the component certificate names
``injector.trellis-system.svc``). With a Kubernetes API (``kubeconfig``, or in a pod) it
keeps the caBundle of the MutatingWebhookConfiguration ``webhook_configuration`` current;
it stores nothing else (pod agents enroll at proxy-cp's ``enroll_port`` themselves).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import AfterValidator, Field

from trellis_common import ids
from trellis_kube.injection import WEBHOOK_CONFIGURATION
from trellis_runtime.settings import (
    Ports,
    ServiceSettings,
    admin_port,
    grpc_port,
    mesh_name,
    watch_timeout,
)


def _namespace(value: str) -> str:
    return ids.validate_dns_label(value, "namespace")


def _service_account(value: str) -> str:
    return ids.validate_dns_subdomain(value, "service account")


def _webhook_service(value: str) -> str:
    return ids.validate_dns_subdomain(value, "webhook service name")


class InjectorSettings(ServiceSettings):
    """Trellis injector: onboarding of proxies (Envoy bootstraps for VMs, the sidecar webhook)."""

    service_name: ClassVar[str] = "injector"

    # No gRPC API of its own yet: the server carries health and reflection only, on a
    # free port unless one is set.
    grpc_port: int = grpc_port(0)
    admin_port: int = admin_port(Ports.INJECTOR_ADMIN)

    xds_host: str = Field(
        "", description="where proxies reach proxy-cp; empty: what proxy-cp announces"
    )
    xds_port: int = Field(
        0, ge=0, le=65535, description="proxy-cp's xDS port for proxies; 0: announced"
    )
    enroll_port: int = Field(
        0, ge=0, le=65535, description="proxy-cp's enrollment port for pod agents; 0: announced"
    )
    certmanager_address: str = Field(
        "", description="certmanager's host:port; empty: from the service registry"
    )
    catalog_address: str = Field(
        "", description="catalog's host:port; empty: from the service registry"
    )

    trust_domain: Annotated[str, AfterValidator(ids.validate_trust_domain)] = Field(
        "cluster.local", description="certmanager's trust domain (of proxy-cp's identity)"
    )
    proxy_cp_namespace: Annotated[str, AfterValidator(_namespace)] = Field(
        "trellis-system", description="namespace of proxy-cp's identity"
    )
    proxy_cp_service_account: Annotated[str, AfterValidator(_service_account)] = Field(
        "proxy-cp", description="service account of proxy-cp's identity"
    )

    call_timeout: float = Field(
        3.0, gt=0, description="deadline of each call to certmanager or the catalog (s)"
    )

    webhook_port: int = Field(
        Ports.INJECTOR_WEBHOOK, ge=0, le=65535, description="the webhook's TLS port; 0: any"
    )
    webhook_service: Annotated[str, AfterValidator(_webhook_service)] = Field(
        "injector.trellis-system.svc",
        description="the name the API server dials the webhook by (its certificate must name it)",
    )
    webhook_client_ca: Path | None = Field(
        None,
        description="CA bundle (PEM) of the API server's webhook client certificate; set: "
        "/mutate answers only callers with a certificate it signed",
    )
    webhook_client_names: str = Field(
        "",
        description="names (CN or DNS SAN, comma-separated) a webhook client certificate "
        "must carry one of; empty: any the CA signed",
    )
    webhook_configuration: str = Field(
        WEBHOOK_CONFIGURATION,
        description="the MutatingWebhookConfiguration whose caBundle the injector keeps current",
    )
    failure_policy: Literal["Fail", "Ignore"] = Field(
        "Fail",
        description="when the control plane cannot be read in time: Fail denies the pod, "
        "Ignore admits it without a sidecar (match the webhook configuration's failurePolicy)",
    )
    webhook_timeout: float = Field(
        8.0, gt=0, description="most time spent on one review (s); the API server's is less"
    )
    kubeconfig: Path | None = Field(
        None,
        description="a kubeconfig for the API server; default: in-cluster when in a pod, "
        "else none (the webhook's caBundle is then not kept)",
    )
    kube_timeout: float = Field(5.0, gt=0, description="deadline of each Kubernetes API call (s)")
    mesh_name: str = mesh_name("injected")
    watch_timeout: int = watch_timeout()
    ca_bundle_resync: float = Field(
        300.0, gt=0, description="how often the caBundle is checked even without a renewal (s)"
    )
    envoy_image: str = Field("envoyproxy/envoy:v1.40.0", description="the sidecar's image")
    init_image: str = Field(
        "ghcr.io/trellis-mesh/trellis-init:0.1.0",
        description="the init container's image: sh and iptables-restore, no Python "
        "(deploy/Dockerfile's init stage)",
    )
    agent_image: str = Field(
        "ghcr.io/trellis-mesh/trellis:0.1.0",
        description="the image of the pod agent (trellis-agent): the Trellis image",
    )
    proxy_mount_path: str = Field(
        "/etc/trellis/proxy", description="the pod agent's folder (key, certificates, bootstrap)"
    )
    sidecar_inbound_port: int = Field(15003, ge=1, le=65535, description="Envoy's inbound port")
    sidecar_outbound_port: int = Field(
        15001, ge=1, le=65535, description="Envoy's outbound port (redirected calls out)"
    )
    sidecar_admin_port: int = Field(
        15000, ge=1, le=65535, description="Envoy's admin port (on 127.0.0.1)"
    )
    sidecar_stats_port: int = Field(
        15010,
        ge=0,
        le=65535,
        description="port of the sidecar's Prometheus statistics (/stats/prometheus); 0: none",
    )
