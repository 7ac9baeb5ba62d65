"""injector settings: ``TRELLIS_INJECTOR_*`` (plus the shared ``TRELLIS_*`` ones).

The injector finds certmanager, the catalog and proxy-cp in the service registry unless
told where they are. ``xds_host``/``xds_port`` are what goes into bootstraps: the address
proxies dial, which is not always the one proxy-cp announces (a VM elsewhere needs a name
or address it can reach, not 127.0.0.1). Each can be set alone; the other half then comes
from the registry.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trellis_common.settings import Ports, ServiceSettings


class InjectorSettings(ServiceSettings):
    service_name: ClassVar[str] = "injector"
    model_config = SettingsConfigDict(
        env_prefix="TRELLIS_INJECTOR_", populate_by_name=True, extra="ignore", frozen=True
    )

    # No gRPC API of its own yet: the server carries health and reflection only, on a
    # free port unless one is set.
    grpc_port: int = Field(0, ge=0, le=65535)
    admin_port: int = Field(Ports.INJECTOR_ADMIN, ge=0, le=65535)

    # Where proxies reach proxy-cp's xDS port; empty / 0: what proxy-cp announces.
    xds_host: str = ""
    xds_port: int = Field(0, ge=0, le=65535)
    certmanager_address: str = ""  # host:port; empty: from the service registry
    catalog_address: str = ""  # host:port; empty: from the service registry

    # proxy-cp's identity, which bootstraps verify its serving certificate against:
    # spiffe://<trust_domain>/ns/<proxy_cp_namespace>/sa/<proxy_cp_service_account>.
    # The trust domain must be certmanager's (TRELLIS_CERTMANAGER_TRUST_DOMAIN).
    trust_domain: str = "cluster.local"
    proxy_cp_namespace: str = "trellis-system"
    proxy_cp_service_account: str = "proxy-cp"

    # Deadline of each call to certmanager or the catalog, in seconds (the CLI waits 10 s
    # for the whole onboarding).
    call_timeout: float = Field(3.0, gt=0)
