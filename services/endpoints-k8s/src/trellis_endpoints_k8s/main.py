"""endpoints-k8s's process: what it is made of; the skeleton (trellis_runtime.service) runs it.

It reads Kubernetes through the official client: a kubeconfig (``kubeconfig``; a local
emulator's ``http://`` server is fine) or, in a pod, the in-cluster configuration. It serves
the same EndpointsProvider API as endpoints-vm and announces itself in the registry as an
``endpoints-provider``, so the catalog takes it in with no configuration: deploying its pod
swaps the provider in.

Replicas (``endpoints-k8s.replicas`` in the chart, ``trellis up --replicas``) each keep
their informers warm and answer the catalog alike (they read the same API server): the
catalog watches one of them (the longest-running) and, when it goes, the next, which
lists in full. No replica leads: there is nothing to do once.
"""

from __future__ import annotations

import logging

from trellis_api import endpoints_pb2_grpc
from trellis_endpoints_k8s.domain.services import PROVIDER
from trellis_endpoints_k8s.settings import EndpointsK8sSettings
from trellis_endpoints_k8s.transport import grpc_api, rest
from trellis_endpoints_k8s.watcher import Watcher
from trellis_kube import client as kube
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

log = logging.getLogger(__name__)


async def build(runtime: ServiceRuntime, settings: EndpointsK8sSettings) -> Parts:
    try:
        api = kube.api_client(settings.kubeconfig)
    except kube.NoKubernetes as exc:
        log.critical("kubernetes.fatal error=%r action=exiting", str(exc))
        raise SystemExit(1) from None
    watcher = Watcher(api, settings.mesh_name, settings.watch_timeout)
    servicer = grpc_api.EndpointsProviderServicer(watcher, runtime.health.rejections)
    return Parts(
        components=watcher.components(),
        grpc=[lambda s: endpoints_pb2_grpc.add_EndpointsProviderServicer_to_server(servicer, s)],
        grpc_services=[grpc_api.SERVICE_NAME],
        readiness={"kubernetes": watcher.ready.is_set},
        routes=lambda app: rest.add_routes(app, watcher),
        attributes={"provider": PROVIDER},
    )


service = Service(EndpointsK8sSettings, "endpoints-provider", build)
main = service.main

if __name__ == "__main__":
    raise SystemExit(main())
