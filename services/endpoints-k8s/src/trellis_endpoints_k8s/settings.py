"""endpoints-k8s settings: flags, ``TRELLIS_ENDPOINTS_K8S_*`` (plus the shared ``TRELLIS_*``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from trellis_runtime.settings import (
    Ports,
    ServiceSettings,
    admin_port,
    grpc_port,
    mesh_name,
    watch_timeout,
)


class EndpointsK8sSettings(ServiceSettings):
    """Trellis endpoints-k8s: the endpoints of Kubernetes Services in the monitored namespaces."""

    service_name: ClassVar[str] = "endpoints-k8s"

    grpc_port: int = grpc_port(Ports.ENDPOINTS_K8S[0])
    admin_port: int = admin_port(Ports.ENDPOINTS_K8S[1])
    kubeconfig: Path | None = Field(
        None, description="a kubeconfig file (http:// servers are fine); unset: in-cluster"
    )
    mesh_name: str = mesh_name("watched")
    watch_timeout: int = watch_timeout()
