"""Reaching the API server with the official ``kubernetes`` client.

A service gets its API client from one place: a kubeconfig file when one is named (a local
run against an emulator or a cluster; ``http://`` servers are fine), else the pod's
in-cluster configuration (service account token and CA, ``KUBERNETES_SERVICE_HOST``).
Neither is an error that says so, not a client that fails later.

The ``kubernetes`` package is imported only when a client is made: it takes a third of a
second, and most processes that import this module (every service, for :func:`in_cluster`)
never talk to an API server.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from trellis_common.defaults import DEFAULT_MESH_NAME as DEFAULT_MESH_NAME

if TYPE_CHECKING:
    from kubernetes import client

#: The label that puts a namespace in a mesh: ``trellis.dev/monitored-by=<mesh name>``.
MONITORED_LABEL = "trellis.dev/monitored-by"


class NoKubernetes(RuntimeError):
    """Neither a kubeconfig nor an in-cluster configuration is available."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


#: Connections kept to the API server: every informer holds one for its watch (the client's
#: default, 10, would make the others wait and drop connections).
POOL_SIZE = 64


def api_client(kubeconfig: str | Path | None) -> client.ApiClient:
    from kubernetes import client, config  # see the module's docstring

    configuration = client.Configuration()
    if kubeconfig:
        path = Path(kubeconfig)
        if not path.is_file():
            raise NoKubernetes(f"kubeconfig {path} does not exist")
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(path), client_configuration=configuration
        )
    elif in_cluster():
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        raise NoKubernetes(
            "no kubeconfig given and not running in a pod (KUBERNETES_SERVICE_HOST is unset)"
        )
    configuration.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(configuration)


def monitored_selector(mesh_name: str) -> str:
    return f"{MONITORED_LABEL}={mesh_name}"
