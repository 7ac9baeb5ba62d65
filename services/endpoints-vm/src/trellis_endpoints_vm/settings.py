"""endpoints-vm settings: flags, ``TRELLIS_ENDPOINTS_VM_*`` (plus the shared ``TRELLIS_*``
ones). Its spec directory (shared with the catalog) holds ServiceEntry and WorkloadEntry
documents; with a kubeconfig, or in a pod, it reads them from the API server too."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from trellis_endpoints_vm.reaping import REAP_AFTER_SECONDS
from trellis_runtime.settings import (
    Ports,
    SpecDirSettings,
    admin_port,
    grpc_port,
    mesh_name,
    watch_timeout,
)


class EndpointsVmSettings(SpecDirSettings):
    """Trellis endpoints-vm: endpoints of workloads outside Kubernetes."""

    service_name: ClassVar[str] = "endpoints-vm"

    grpc_port: int = grpc_port(Ports.ENDPOINTS_VM[0])
    admin_port: int = admin_port(Ports.ENDPOINTS_VM[1])
    expiry_interval: float = Field(
        0.5, gt=0, description="seconds between sweeps for registrations past their TTL"
    )
    reap_after: float = Field(
        REAP_AFTER_SECONDS,
        ge=0,
        description="seconds a workload with a TTL may stay expired before the leader "
        "deregisters it (its agent must register again); 0: never",
    )
    store_timeout: float = Field(
        2.0, gt=0, description="longest a REST call waits on a Redis write before it fails (s)"
    )
    store_check_interval: float = Field(
        5.0,
        gt=0,
        description="seconds between checks that Redis still holds every registration",
    )
    kubeconfig: Path | None = Field(
        None,
        description="a kubeconfig file (http:// servers are fine) to read ServiceEntries and "
        "WorkloadEntries from; unset: the pod's own account in a pod, else none",
    )
    mesh_name: str = mesh_name("read (their objects)")
    watch_timeout: int = watch_timeout()
