"""proxy-cp settings: ``TRELLIS_PROXY_CP_*`` (plus the shared ``TRELLIS_*`` ones)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trellis_common.settings import Ports, ServiceSettings


class ProxyCpSettings(ServiceSettings):
    service_name: ClassVar[str] = "proxy-cp"
    model_config = SettingsConfigDict(
        env_prefix="TRELLIS_PROXY_CP_", populate_by_name=True, extra="ignore", frozen=True
    )

    grpc_port: int = Field(Ports.PROXY_CP[0], ge=0, le=65535)  # xDS, mTLS only
    admin_port: int = Field(Ports.PROXY_CP[1], ge=0, le=65535)
    # Where proxies reach the xDS port (all interfaces by default: proxies are remote).
    xds_host: str = "0.0.0.0"
    catalog_address: str = ""  # empty: from the service registry
    certmanager_address: str = ""  # empty: from the service registry
    # proxy-cp's own identity: the serving certificate of the xDS port.
    namespace: str = "trellis-system"
    service_account: str = "proxy-cp"
    # Expected proxies (clients/expected.py): listings of the catalog start at least this
    # far apart (s); a listing says yes for this long; a proxy a listing did not name is
    # refused without asking again for this long.
    expected_min_interval: float = Field(0.25, ge=0)
    expected_max_age: float = Field(10.0, gt=0)
    expected_refused_for: float = Field(5.0, ge=0)
    # Caps on what one proxy may ask (transport/limits.py).
    max_node_metadata_bytes: int = Field(16 * 1024, ge=0)
    max_resource_names: int = Field(1024, ge=1)
    max_resource_name_bytes: int = Field(512, ge=1)
    max_streams_per_proxy: int = Field(4, ge=1)
