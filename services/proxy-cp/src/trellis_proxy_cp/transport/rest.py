"""proxy-cp's admin REST routes: connected proxies, and the configuration sent to one.

Configuration answers are what the proxy was sent, as JSON, with every private key
replaced by ``[redacted]``: the admin API never shows a key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query
from google.protobuf import json_format

from trellis_proxy_cp import types
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRegistry

REDACTED = "[redacted]"
_BY_SHORT = {short: url for url, short in types.SHORT.items()}


def redact(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (REDACTED if k in ("private_key", "privateKey") else redact(v))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [redact(v) for v in node]
    return node


def stream_json(stream: ProxyStream) -> dict[str, Any]:
    return {
        "proxy": stream.proxy_id,
        "identity": stream.identity,
        "node_id": stream.node_id,
        "serial": stream.serial,  # of the certificate the stream was opened with
        "envoy_version": stream.envoy_version,
        "protocol": stream.protocol,
        "opened_at": stream.opened_at,
        "snapshot_key": stream.key,
        "types": {
            types.SHORT.get(url, url): {
                "sent_version": state.sent_version,
                "acked_version": state.acked_version,
                "nacks": state.nack_count,
                "last_error": state.last_error,
            }
            for url, state in sorted(stream.types.items())
        },
    }


def add_routes(
    app: FastAPI, streams: StreamRegistry, cache: SnapshotCache, control_plane: ProxyControlPlane
) -> None:
    router = APIRouter(prefix="/v1", tags=["proxies"])

    @router.get("/proxies")
    async def proxies() -> dict[str, Any]:
        return {
            "proxies": [stream_json(s) for s in sorted(streams, key=lambda s: s.proxy_id)],
            "groups": [
                {
                    "key": g.key,
                    "identity": g.identity,
                    "proxies": sorted(g.proxies),
                    "last_error": g.last_error,
                }
                for g in control_plane.groups.values()
            ],
        }

    @router.get("/proxies/{proxy_id}/config")
    async def config(
        proxy_id: str,
        type: list[str] = Query(  # noqa: B008
            default=[], description="cds, eds, lds, rds, sds (default: all)"
        ),
    ) -> dict[str, Any]:
        found = streams.of_proxy(proxy_id)
        if not found:
            raise HTTPException(404, f"proxy {proxy_id!r} is not connected to this proxy-cp")
        unknown = [t for t in type if t not in _BY_SHORT]
        if unknown:
            raise HTTPException(422, f"type: unknown {unknown}; use cds, eds, lds, rds or sds")
        snapshot = cache.get(found[0].key)
        if snapshot is None:
            raise HTTPException(404, f"no configuration built for proxy {proxy_id!r} yet")
        wanted = [_BY_SHORT[t] for t in type] or list(types.ORDER)
        return {
            "proxy": proxy_id,
            "version": snapshot.version,
            "resources": {
                types.SHORT[url]: [
                    redact(json_format.MessageToDict(r.body, preserving_proto_field_name=True))
                    for _, r in sorted(snapshot.of_type(url).items())
                ]
                for url in wanted
            },
        }

    app.include_router(router)
