"""endpoints-k8s's process: what it is made of; the skeleton (trellis_runtime.service) runs it.

It reads Kubernetes through the official client: a kubeconfig (``kubeconfig``; a local
emulator's ``http://`` server is fine) or, in a pod, the in-cluster configuration. It serves
the same EndpointsProvider API as endpoints-vm and announces itself in the registry as an
``endpoints-provider``, so the catalog takes it in with no configuration: deploying its pod
swaps the provider in.

Replicas (``endpoints-k8s.replicas`` in the chart, ``trellis up --replicas``) each keep
their informers warm and answer the catalog alike (they read the same API server), but
only the leader of the election ``endpoints-k8s`` (a Lease in a cluster) signals changes:
N replicas would otherwise send N signals per change. A replica that takes over signals
``resync`` first, so the catalog lists the provider again, which covers any change its
predecessor saw but had not signalled; while no replica leads (a takeover, at most a
lease's duration), the catalog keeps every endpoint it has.
"""

from __future__ import annotations

import asyncio
import logging

from trellis_api import endpoints_pb2_grpc
from trellis_endpoints_k8s.domain.services import PROVIDER
from trellis_endpoints_k8s.settings import EndpointsK8sSettings
from trellis_endpoints_k8s.transport import grpc_api, rest
from trellis_endpoints_k8s.watcher import Watcher
from trellis_kube import client as kube
from trellis_kube.leadership import elect_for
from trellis_runtime import lifecycle
from trellis_runtime.events import RESYNC
from trellis_runtime.runtime import ServiceRuntime
from trellis_runtime.service import Parts, Service

log = logging.getLogger(__name__)

TOPIC = "endpoints"


async def build(runtime: ServiceRuntime, settings: EndpointsK8sSettings) -> Parts:
    try:
        api = kube.api_client(settings.kubeconfig)
    except kube.NoKubernetes as exc:
        log.critical("kubernetes.fatal error=%r action=exiting", str(exc))
        raise SystemExit(1) from None
    outbox = runtime.outbox
    leadership = elect_for(settings, redis=runtime.redis, health=runtime.health, kube_api=api)
    gained = asyncio.Event()
    leadership.subscribe(lambda leading: gained.set() if leading else None)

    async def signal(kind: str, key: str) -> int:
        if not leadership.leading:
            return 0  # the leader signals; this replica keeps its views warm
        return await outbox.signal(TOPIC, kind, key)

    async def take_over(stop: asyncio.Event) -> None:
        """Each time this replica starts leading: the catalog lists the provider again."""
        while not stop.is_set():
            await lifecycle.first(gained.wait(), stop.wait())
            if gained.is_set():
                gained.clear()
                log.info("endpoints.leading action=resync")
                await outbox.signal(TOPIC, RESYNC, "")

    watcher = Watcher(api, settings.mesh_name, signal, settings.watch_timeout)
    servicer = grpc_api.EndpointsProviderServicer(watcher, runtime.health.rejections)
    return Parts(
        components={
            **watcher.components(),
            "leader election": leadership.run,
            "take over": take_over,
        },
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
