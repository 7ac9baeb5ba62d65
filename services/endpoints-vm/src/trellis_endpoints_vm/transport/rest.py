"""endpoints-vm's REST API: register, heartbeat, deregister, list; services and documents.

Routes that change state need a credential (:mod:`.credentials`): registering, the admin
token or an onboarding token scoped to the workload's identity, and the answer carries the
workload's new heartbeat token (``heartbeat_token``, shown once, kept only as a digest);
heartbeats, that token only; deregistering, that token or the admin token. A body that is
not valid gets 422 with ``field`` and a reason; the registry is left as it was.

While Redis is unavailable a registration or deregistration gets 503 naming Redis (nothing
changed; retry), and a heartbeat is still accepted (``persisted: false``: it counts, and is
written when Redis is back). Deregistering the id of a stored record that was refused at
load (corrupt) deletes that record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field

from trellis_endpoints_vm.domain.views import ServiceKey, ServiceView
from trellis_endpoints_vm.domain.workloads import InvalidWorkload, Workload, new_heartbeat_token
from trellis_endpoints_vm.manager import EndpointsManager, StoreUnavailable, UnknownWorkload
from trellis_endpoints_vm.transport.credentials import Credentials, Refused
from trellis_identity import onboarding

_bearer = HTTPBearer(auto_error=False)


class PortBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("", description="port name; empty for a bare number")
    number: int


class RegistrationBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str
    name: str
    services: list[str] = Field(min_length=1)
    address: str
    ports: list[PortBody] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    service_account: str = ""
    locality: str = ""
    network: str = ""
    weight: int = 1
    ttl: float | None = Field(None, description="seconds; absent: until deregistered")

    def workload(self) -> Workload:
        return Workload(
            namespace=self.namespace,
            name=self.name,
            services=tuple(self.services),
            address=self.address,
            ports=tuple((p.name, p.number) for p in self.ports),
            labels=tuple(sorted(self.labels.items())),
            service_account=self.service_account,
            locality=self.locality,
            network=self.network,
            weight=self.weight,
            ttl=self.ttl,
        )


def workload_json(
    workload: Workload, alive: bool, reaped_at: float | None = None
) -> dict[str, Any]:
    """A workload as the API lists it; ``reaped_at``: when the leader deregisters it if it
    stays expired (``reap_after``), None without a TTL or with reaping off."""
    return {
        "namespace": workload.namespace,
        "name": workload.name,
        "services": list(workload.services),
        "address": workload.address,
        "ports": [{"name": n, "number": p} for n, p in workload.ports],
        "labels": dict(workload.labels),
        "service_account": workload.service_account,
        "locality": workload.locality,
        "network": workload.network,
        "weight": workload.weight,
        "ttl": workload.ttl,
        "registered_at": workload.registered_at,
        "last_heartbeat": workload.last_heartbeat,
        "expires_at": workload.expires_at,
        "alive": alive,
        "reaped_at": reaped_at,
    }


def view_json(view: ServiceView) -> dict[str, Any]:
    info = view.info
    return {
        "namespace": info.key.namespace,
        "name": info.key.name,
        "source": info.source,
        "ports": [
            {
                "name": p.name,
                "number": p.number,
                "protocol": p.protocol,
                "target_port": p.target_port,
            }
            for p in info.ports
        ],
        "hosts": list(info.hosts),
        "addresses": list(info.addresses),
        "location": info.location,
        "resolution": info.resolution,
        "export_to": list(info.export_to),
        "subject_alt_names": list(info.subject_alt_names),
        "endpoints": [
            {
                "address": e.address,
                "ports": dict(e.ports),
                "labels": dict(e.labels),
                "locality": e.locality,
                "network": e.network,
                "weight": e.weight,
                "service_account": e.service_account,
                "workload": e.workload,
                "source": e.source,
            }
            for e in view.endpoints
        ],
    }


def add_routes(
    app: FastAPI,
    manager: EndpointsManager,
    credentials: Credentials,
    documents: Callable[[], dict[str, Any]],
) -> None:
    router = APIRouter(prefix="/v1")

    @app.exception_handler(Refused)
    async def refused(_: Any, exc: Refused) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.detail, "reason": str(exc.reason), "token_id": exc.token_id},
            status_code=exc.status,
            headers={"WWW-Authenticate": "Bearer"} if exc.status == 401 else None,
        )

    def bearer(given: HTTPAuthorizationCredentials | None) -> str | None:
        return given.credentials if given is not None else None

    async def registrant(
        given: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
    ) -> onboarding.Caller:
        return await credentials.registrant(bearer(given))

    @app.exception_handler(InvalidWorkload)
    async def invalid(_: Any, exc: InvalidWorkload) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=422)

    @app.exception_handler(StoreUnavailable)
    async def unavailable(_: Any, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc), "store": "redis"}, status_code=503, headers={"Retry-After": "1"}
        )

    @router.post("/workloads", status_code=201, tags=["workloads"])
    async def register(
        body: RegistrationBody,
        caller: onboarding.Caller = Depends(registrant),  # noqa: B008
    ) -> JSONResponse:
        """Register a workload; the answer's ``heartbeat_token`` is the only credential its
        heartbeats are accepted with (a new one at each registration)."""
        asked = body.workload()
        existing = manager.workload(asked.id)
        credentials.may_register(caller, asked, existing)
        credentials.may_join(caller, asked, manager.registry.members)
        if existing is None:  # registering again (a new heartbeat token) takes no use
            await credentials.take_use(caller, asked)
        token, digest = new_heartbeat_token()
        workload = await manager.register(replace(asked, heartbeat_digest=digest))
        return JSONResponse(
            {
                **workload_json(workload, True, manager.reaper.reaped_at(workload)),
                "heartbeat_token": token,
            },
            status_code=201,
            headers={"Cache-Control": "no-store"},
        )

    @router.post("/workloads/{namespace}/{name}/heartbeat", tags=["workloads"])
    async def heartbeat(
        namespace: str,
        name: str,
        given: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
    ) -> dict[str, Any]:
        workload_id = f"{namespace}/{name}"
        current = manager.workload(workload_id)
        if current is None:
            credentials.may_beat_unknown(bearer(given), workload_id)
            raise HTTPException(404, f"{UnknownWorkload(workload_id)}; register it first")
        credentials.may_beat(bearer(given), current)
        try:
            workload = await manager.heartbeat(workload_id)
        except UnknownWorkload as exc:  # deregistered meanwhile
            raise HTTPException(404, f"{exc}; register it first") from exc
        return {
            "workload": workload.id,
            "alive": True,
            "expires_at": workload.expires_at,
            "persisted": workload.id not in manager.keeper.pending,
        }

    @router.delete("/workloads/{namespace}/{name}", tags=["workloads"])
    async def deregister(
        namespace: str,
        name: str,
        given: HTTPAuthorizationCredentials | None = Depends(_bearer),  # noqa: B008
    ) -> Response:
        """The workload's own heartbeat token, or the admin token (operators)."""
        workload_id = f"{namespace}/{name}"
        credentials.may_deregister(bearer(given), manager.workload(workload_id), workload_id)
        try:
            await manager.deregister(workload_id)
        except UnknownWorkload as exc:
            raise HTTPException(404, str(exc)) from exc
        return Response(status_code=204)

    @router.get("/workloads", tags=["workloads"])
    async def list_workloads(namespace: str = "") -> dict[str, Any]:
        return {
            "revision": manager.revision,
            "workloads": [
                workload_json(w, alive, manager.reaper.reaped_at(w))
                for w, alive in manager.workloads()
                if not namespace or w.namespace == namespace
            ],
        }

    @router.get("/services", tags=["services"])
    async def list_services(namespace: str = "") -> dict[str, Any]:
        return {
            "revision": manager.revision,
            "services": [view_json(v) for v in manager.views(namespace)],
        }

    @router.get("/services/{namespace}/{name}", tags=["services"])
    async def get_service(namespace: str, name: str) -> dict[str, Any]:
        view = manager.view(ServiceKey(namespace, name))
        if view is None:
            raise HTTPException(404, f"endpoints-vm knows no service {namespace}/{name}")
        return view_json(view)

    @router.get("/documents", tags=["documents"])
    async def list_documents() -> dict[str, Any]:
        return documents()

    app.include_router(router)
