"""endpoints-k8s's admin REST routes: its services (in endpoints-vm's shape), a proxy's pod.

``GET /v1/services`` answers as endpoints-vm's does, so tools read either provider the same
way; ``GET /v1/proxies/{uuid}`` resolves the pod the injector labelled with that proxy UUID
(the pod's uid); ``GET /v1/kubernetes`` shows the informers (lists, watches, 410s,
events) and the monitored namespaces.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException

from trellis_endpoints_k8s.domain.services import ServiceView
from trellis_endpoints_k8s.watcher import Watcher


def view_json(found: ServiceView) -> dict[str, Any]:
    return {
        "namespace": found.namespace,
        "name": found.name,
        "source": "kubernetes",
        "ports": [asdict(p) for p in found.ports],
        "hosts": [],
        "addresses": list(found.addresses),
        "location": "MESH_INTERNAL",
        "resolution": "STATIC",
        "export_to": [],
        "subject_alt_names": [],
        "endpoints": [
            {
                "address": e.address,
                "ports": dict(e.ports),
                "labels": dict(e.labels),
                "locality": e.locality,
                "network": "",
                "weight": 0,
                "service_account": e.service_account,
                "workload": e.workload,
                "source": "kubernetes",
                "draining": e.draining,
            }
            for e in found.endpoints
        ],
        "warnings": list(found.warnings),
    }


def add_routes(app: FastAPI, watcher: Watcher) -> None:
    router = APIRouter(prefix="/v1")

    @router.get("/services", tags=["services"])
    async def list_services(namespace: str = "") -> dict[str, Any]:
        return {
            "revision": watcher.revision,
            "services": [view_json(v) for v in watcher.list(namespace)],
        }

    @router.get("/services/{namespace}/{name}", tags=["services"])
    async def get_service(namespace: str, name: str) -> dict[str, Any]:
        found = watcher.views.get((namespace, name))
        if found is None:
            raise HTTPException(404, f"endpoints-k8s knows no service {namespace}/{name}")
        return view_json(found)

    @router.get("/proxies/{proxy_uuid}", tags=["proxies"])
    async def proxy(proxy_uuid: str) -> dict[str, Any]:
        pod = watcher.proxy(proxy_uuid)
        if pod is None:
            raise HTTPException(404, f"no pod carries the proxy UUID {proxy_uuid}")
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        return {
            "proxy_uuid": proxy_uuid,
            "namespace": meta.get("namespace"),
            "pod": meta.get("name"),
            "service_account": spec.get("serviceAccountName") or "default",
            "labels": meta.get("labels") or {},
            "pod_ip": (pod.get("status") or {}).get("podIP", ""),
        }

    @router.get("/kubernetes", tags=["status"])
    async def status() -> dict[str, Any]:
        return {
            "mesh": watcher.namespaces.mesh_name,
            "monitored_namespaces": sorted(watcher.namespaces.names()),
            "informers": {
                name: {**asdict(i.stats), "revision": i.revision, "objects": len(i.objects)}
                for name, i in {
                    "namespaces": watcher.namespaces.informer,
                    **watcher.informers,
                }.items()
            },
            "services": len(watcher.views),
        }

    app.include_router(router)
