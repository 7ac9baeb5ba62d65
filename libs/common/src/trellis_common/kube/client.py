"""Reaching the API server with the official ``kubernetes`` client.

A service gets its API client from one place: a kubeconfig file when one is named (a local
run against an emulator or a cluster; ``http://`` servers are fine), else the pod's
in-cluster configuration (service account token and CA, ``KUBERNETES_SERVICE_HOST``).
Neither is an error that says so, not a client that fails later.
"""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

#: The label that puts a namespace in a mesh: ``trellis.dev/monitored-by=<mesh name>``.
MONITORED_LABEL = "trellis.dev/monitored-by"
DEFAULT_MESH_NAME = "trellis"


class NoKubernetes(RuntimeError):
    """Neither a kubeconfig nor an in-cluster configuration is available."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def api_client(kubeconfig: str | Path | None) -> client.ApiClient:
    if kubeconfig:
        path = Path(kubeconfig)
        if not path.is_file():
            raise NoKubernetes(f"kubeconfig {path} does not exist")
        loaded: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(path)
        )
        return loaded
    if in_cluster():
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        return client.ApiClient(configuration)
    raise NoKubernetes(
        "no kubeconfig given and not running in a pod (KUBERNETES_SERVICE_HOST is unset)"
    )


def monitored_selector(mesh_name: str) -> str:
    return f"{MONITORED_LABEL}={mesh_name}"
