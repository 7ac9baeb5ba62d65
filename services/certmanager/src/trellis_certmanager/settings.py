"""certmanager settings: ``TRELLIS_CERTMANAGER_*`` (plus the shared ``TRELLIS_*`` ones)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_common.settings import Ports, ServiceSettings


class CertManagerSettings(ServiceSettings):
    service_name: ClassVar[str] = "certmanager"
    model_config = SettingsConfigDict(
        env_prefix="TRELLIS_CERTMANAGER_", populate_by_name=True, extra="ignore", frozen=True
    )

    grpc_port: int = Field(Ports.CERTMANAGER[0], ge=0, le=65535)
    admin_port: int = Field(Ports.CERTMANAGER[1], ge=0, le=65535)

    key_algorithm: KeyAlgorithm = KeyAlgorithm.ECDSA_P256
    trust_domain: str = "cluster.local"
    cluster_domain: str = "cluster.local"
    service_cert_validity: dt.timedelta = dt.timedelta(hours=48)
    proxy_cert_validity: dt.timedelta = dt.timedelta(days=365)
    root_validity: dt.timedelta = dt.timedelta(days=3650)
    validity_jitter: float = Field(0.1, ge=0, lt=0.5)
    renew_fraction: float = Field(0.75, gt=0, lt=1)
    rotation_interval: float = Field(5.0, gt=0)
    # Records this long past their expiry are deleted (the CA never is).
    prune_after: dt.timedelta = dt.timedelta(days=1)

    # The operator's own CA (root or intermediate): certificate, key, and chain to a root.
    ca_cert_file: Path | None = None
    ca_key_file: Path | None = None
    ca_bundle_file: Path | None = None
