"""Who is on the other end of an xDS stream, and may it be served?

The TLS handshake already required a client certificate from the mesh CA (a foreign CA
never reaches this code). Here: its common name must be a proxy certificate's
(``<proxy-uuid>.<service>.<namespace>``), the catalog must expect that proxy (certmanager
issued for it at onboarding), the Envoy node id must be that common name, and the node
metadata must give valid per-proxy settings. Each refusal names what is wrong. Whether a
proxy is expected is asked of ``expected`` (the catalog client's cache of ``ListProxies``);
when the catalog cannot tell, the stream is refused UNAVAILABLE (retry), not PERMISSION_DENIED.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import json_format

from trellis_common.ids import InvalidIdentifier, ProxyCommonName
from trellis_proxy_cp.clients.expected import ExpectationUnknown
from trellis_proxy_cp.core import ProxyControlPlane
from trellis_proxy_cp.translate.settings import InvalidNodeMetadata, from_metadata
from trellis_proxy_cp.transport.streams import ProxyStream, StreamRefused

log = logging.getLogger(__name__)

Expected = Callable[[str], Awaitable[str | None]]


def peer_common_name(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    values = list(context.auth_context().get("x509_common_name") or [])
    return values[0].decode() if values else ""


class MeshAuthorizer:
    def __init__(self, control_plane: ProxyControlPlane, expected: Expected) -> None:
        self._control_plane = control_plane
        self._expected = expected

    async def authorize(
        self, context: grpc.aio.ServicerContext[Any, Any], node: Any
    ) -> ProxyStream:
        common_name = peer_common_name(context)
        if not common_name:
            raise StreamRefused(
                grpc.StatusCode.UNAUTHENTICATED,
                "no client certificate: proxy-cp serves only proxies presenting a proxy "
                "certificate from the mesh CA",
                "no_certificate",
            )
        try:
            proxy = ProxyCommonName.parse(common_name)
        except InvalidIdentifier as exc:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED, str(exc), "not_a_proxy_certificate"
            ) from None
        try:
            account = await self._expected(common_name)
        except ExpectationUnknown as exc:
            raise StreamRefused(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot tell whether proxy {common_name} is expected: the catalog did not "
                f"answer ({exc}); retry later",
                "catalog_unavailable",
            ) from None
        if account is None:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"proxy {common_name} is not expected: no proxy certificate was issued for it "
                f"(onboard it with `trellis vm bootstrap` or the injector)",
                "not_expected",
            )
        if node.id != common_name:
            raise StreamRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"node id {node.id!r} does not match the certificate's common name {common_name!r}",
                "node_id_mismatch",
            )
        try:
            settings = from_metadata(json_format.MessageToDict(node.metadata))
        except InvalidNodeMetadata as exc:
            raise StreamRefused(
                grpc.StatusCode.INVALID_ARGUMENT, str(exc), "invalid_metadata"
            ) from None
        identity = f"{proxy.namespace}/{proxy.service}"
        key = await self._control_plane.attach(common_name, identity, account, settings)
        return ProxyStream(proxy_id=common_name, key=key, node_id=node.id, identity=identity)
