"""endpoints-vm settings: ``TRELLIS_ENDPOINTS_VM_*`` (plus the shared ``TRELLIS_*`` ones)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from trellis_common.settings import Ports, ServiceSettings


class EndpointsVmSettings(ServiceSettings):
    service_name: ClassVar[str] = "endpoints-vm"
    model_config = SettingsConfigDict(
        env_prefix="TRELLIS_ENDPOINTS_VM_", populate_by_name=True, extra="ignore", frozen=True
    )

    grpc_port: int = Field(Ports.ENDPOINTS_VM[0], ge=0, le=65535)
    admin_port: int = Field(Ports.ENDPOINTS_VM[1], ge=0, le=65535)
    # The mesh's directory of YAML documents (shared with the catalog); unset: none.
    spec_dir: Path | None = Field(
        None, validation_alias=AliasChoices("spec_dir", "TRELLIS_SPEC_DIR")
    )
    # The spec directory is watched with inotify, and rescanned in full every
    # spec_rescan_interval seconds in case an event was lost; where inotify cannot watch,
    # it is polled every spec_poll_interval seconds instead.
    spec_rescan_interval: float = Field(30.0, gt=0)
    spec_poll_interval: float = Field(0.5, gt=0)
    expiry_interval: float = Field(0.5, gt=0)
    # Longest a REST call waits on a Redis write before it counts as an outage.
    store_timeout: float = Field(2.0, gt=0)
    # How often to check that Redis still holds every registration (refilled if it lost them).
    store_check_interval: float = Field(5.0, gt=0)
