"""The catalog's admin REST routes: resources with status, services, views, proxies, policy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query
from google.protobuf import json_format

from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.access.explain import explain
from trellis_catalog.domain.model.views import Identity
from trellis_catalog.transport.protos import to_proto
from trellis_common.model import MeshService, ServiceAccount


def _pair(text: str, what: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name:
        raise HTTPException(422, f"{what} must be '<namespace>/<name>', got {text!r}")
    return namespace, name


def add_routes(app: FastAPI, catalog: Catalog, source: Callable[[], dict[str, Any]]) -> None:
    router = APIRouter(prefix="/v1")

    @router.get("/resources", tags=["specification"])
    async def resources(state: str = "") -> dict[str, Any]:
        found = [*catalog.spec.statuses.values(), *catalog.account_conflicts()]
        statuses = [asdict(s) for s in found]
        return {
            "source": source(),
            "resources": [s for s in statuses if not state or s["state"] == state],
        }

    @router.get("/services", tags=["catalog"])
    async def services() -> dict[str, Any]:
        return {
            "revision": catalog.revision,
            "providers": sorted(catalog.providers()),
            "services": [
                {
                    "namespace": s.namespace,
                    "name": s.name,
                    "declared": k.declared,
                    "providers": list(k.providers),
                    "location": k.location,
                    "ports": [asdict(p) for p in k.ports],
                    "endpoints": len(k.endpoints),
                    "hosts": list(k.hosts),
                    "service_account": catalog.account_of(s),
                }
                for s, k in catalog.services.items()
            ],
        }

    @router.get("/views", tags=["catalog"])
    async def views() -> dict[str, Any]:
        return {
            "revision": catalog.revision,
            "views": [
                {"identity": str(i), "version": v}
                for i, v in sorted(catalog.view_versions().items())
            ],
        }

    @router.get("/views/{namespace}/{service}", tags=["catalog"])
    async def view(namespace: str, service: str) -> dict[str, Any]:
        identity = Identity(namespace, service)
        policy = catalog.policy_for(identity)
        view = to_proto(policy, catalog.clusters, catalog.view_version(identity), catalog.revision)
        return json_format.MessageToDict(view, preserving_proto_field_name=True)

    @router.get("/proxies", tags=["proxies"])
    async def proxies() -> dict[str, Any]:
        return {
            "proxies": [
                {**asdict(p), "identity": str(p.identity), "participant": catalog.participant(p)}
                for p in sorted(catalog.proxies.values(), key=lambda p: p.common_name)
            ]
        }

    @router.get("/policy/check", tags=["policy"])
    async def check(
        source: str = Query(..., alias="from", description="<namespace>/<service account>"),
        destination: str = Query(..., alias="to", description="<namespace>/<service>"),
    ) -> dict[str, Any]:
        decision = explain(
            catalog.builder(),
            ServiceAccount(*_pair(source, "from")),
            MeshService(*_pair(destination, "to")),
        )
        return {
            "from": source,
            "to": destination,
            "allowed": decision.allowed,
            "reason": decision.reason,
            "policies": list(decision.policies),
            "routes": [asdict(r) for r in decision.routes],
            "permissive": decision.permissive,
            "conflicts": list(decision.conflicts),
            "shaped_by": list(decision.shaped_by),
        }

    app.include_router(router)
