"""injector settings: flags, ``TRELLIS_INJECTOR_*`` (plus the shared ``TRELLIS_*`` ones).

The injector finds certmanager, the catalog and proxy-cp in the service registry unless
told where they are. ``xds_host``/``xds_port`` are what goes into bootstraps: the address
proxies dial, which is not always the one proxy-cp announces (a VM elsewhere needs a name
or address it can reach, not 127.0.0.1). Each can be set alone; the other half then comes
from the registry.

proxy-cp's identity, which bootstraps verify its serving certificate against, is
``spiffe://<trust_domain>/ns/<proxy_cp_namespace>/sa/<proxy_cp_service_account>``; each
part is checked here, so a bad one stops the service before it starts, naming the setting.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AfterValidator, Field

from trellis_common import ids
from trellis_common.settings import Ports, ServiceSettings, admin_port, grpc_port


def _namespace(value: str) -> str:
    return ids.validate_dns_label(value, "namespace")


def _service_account(value: str) -> str:
    return ids.validate_dns_subdomain(value, "service account")


class InjectorSettings(ServiceSettings):
    """Trellis injector: onboarding of proxies (Envoy bootstraps)."""

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
