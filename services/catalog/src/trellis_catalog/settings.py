"""catalog settings: ``TRELLIS_CATALOG_*`` (plus the shared ``TRELLIS_*`` ones)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from trellis_common.settings import Ports, ServiceSettings


class CatalogSettings(ServiceSettings):
    service_name: ClassVar[str] = "catalog"
    model_config = SettingsConfigDict(
        env_prefix="TRELLIS_CATALOG_", populate_by_name=True, extra="ignore", frozen=True
    )

    grpc_port: int = Field(Ports.CATALOG[0], ge=0, le=65535)
    admin_port: int = Field(Ports.CATALOG[1], ge=0, le=65535)
    spec_dir: Path | None = Field(
        None, validation_alias=AliasChoices("spec_dir", "TRELLIS_SPEC_DIR")
    )
    # The spec directory is watched with inotify, and rescanned in full every
    # spec_rescan_interval seconds in case an event was lost; where inotify cannot watch,
    # it is polled every spec_poll_interval seconds instead.
    spec_rescan_interval: float = Field(30.0, gt=0)
    spec_poll_interval: float = Field(0.5, gt=0)
    trust_domain: str = "cluster.local"
    cluster_domain: str = "cluster.local"
    # Where certmanager is; empty: found in the service registry.
    certmanager_address: str = ""
    debounce_quiet: float = Field(0.02, ge=0)
    debounce_max: float = Field(0.2, gt=0)
    discovery_interval: float = Field(1.0, gt=0)
    # A provider missing from the registry keeps its endpoints this long (seconds).
    provider_grace: float = Field(30.0, ge=0)
