"""catalog settings: flags, ``TRELLIS_CATALOG_*`` (plus the shared ``TRELLIS_*`` ones)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from trellis_runtime.settings import (
    Ports,
    SpecDirSettings,
    admin_port,
    grpc_port,
    mesh_name,
)


class CatalogSettings(SpecDirSettings):
    """Trellis catalog: the mesh specification and per-identity views."""

    service_name: ClassVar[str] = "catalog"

    grpc_port: int = grpc_port(Ports.CATALOG[0])
    admin_port: int = admin_port(Ports.CATALOG[1])
    trust_domain: str = Field("cluster.local", description="SPIFFE trust domain of the mesh")
    cluster_domain: str = Field("cluster.local", description="DNS suffix of service names")
    certmanager_address: str = Field(
        "", description="certmanager's host:port; empty: from the service registry"
    )
    discovery_interval: float = Field(1.0, gt=0, description="seconds between provider sweeps")
    kubeconfig: Path | None = Field(
        None,
        description="read the mesh specification from this cluster too (in a pod: in-cluster)",
    )
    mesh_name: str = mesh_name("read")
    control_plane_namespace: str = Field(
        "trellis-system", description="where a MeshConfig is read besides monitored namespaces"
    )
    meshconfig_configmap: str = Field(
        "",
        description="a ConfigMap in the control plane's namespace whose data[meshconfig.yaml] "
        "is the MeshConfig (instead of the CRD; empty: none)",
    )
    redis_audit_interval: float = Field(
        5.0, ge=0, description="seconds between reads of what Redis refused; 0: off"
    )
    provider_grace: float = Field(30.0, ge=0, description="seconds a lost provider keeps endpoints")
    provider_sync_timeout: float = Field(
        10.0,
        gt=0,
        description="at start, seconds to wait for the live providers' endpoints before the "
        "first views are made",
    )
