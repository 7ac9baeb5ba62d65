"""Admin routes of the Destination API: what a client asking for a name would receive now.

``GET /v1/destinations`` sums up the table and the open streams; ``GET
/v1/destinations/get?path=NAME`` and ``/v1/destinations/profile?path=NAME`` answer with the
messages a new ``Get`` or ``GetProfile`` stream for ``NAME`` would start with, as JSON
(``trellis dst get|profile`` prints them). A path that names nothing is answered 422 with
the reason a stream would get.

They need the admin token: they answer what any name resolves to, for any identity, where the
Destination API itself answers a proxy over mTLS only about what its identity may reach
(:mod:`.access`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException
from google.protobuf import json_format
from google.protobuf.message import Message

from trellis_api.linkerd import destination_pb2 as dpb
from trellis_proxy_cp.discovery.server import Discovery
from trellis_proxy_cp.discovery.updates import get_updates
from trellis_proxy_cp.translate import linkerd


def _json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def readable(update: dpb.Update) -> dict[str, Any]:
    """The update as JSON, each address also as ``text`` (``ip:port``), for people."""
    body = _json(update)
    if update.WhichOneof("update") == "add":
        for addr, json_addr in zip(update.add.addrs, body["add"].get("addrs", []), strict=True):
            json_addr.setdefault("addr", {})["text"] = linkerd.address_text(addr.addr)
    return body


def add_routes(app: FastAPI, discovery: Discovery, guard: Any) -> None:
    router = APIRouter(
        prefix="/v1/destinations", tags=["destinations"], dependencies=[Depends(guard)]
    )

    def target(path: str, rpc: str) -> linkerd.Authority:
        try:
            found = linkerd.parse_authority(path, discovery.options.cluster_domain)
            discovery.check(found, rpc)
        except linkerd.InvalidAuthority as exc:
            raise HTTPException(422, str(exc)) from None
        return found

    @router.get("")
    async def summary() -> dict[str, Any]:
        return {
            "destinations": len(discovery.table.by_name),
            "watchers": discovery.table.watching,
            "names": sorted(discovery.table.by_name),
        }

    @router.get("/get")
    async def get(path: str) -> dict[str, Any]:
        asked = target(path, "Get")
        now = discovery.resolve(asked)
        updates = get_updates(None, now, discovery.labels(asked))
        return {
            "path": path,
            "exists": now.exists,
            "updates": [readable(u) for u in updates],
        }

    @router.get("/profile")
    async def profile(path: str) -> dict[str, Any]:
        return {"path": path, "profile": _json(discovery.profile(target(path, "GetProfile")))}

    app.include_router(router)
