"""The workload certificate of a proxyless gRPC workload, fetched and kept fresh over SDS.

A proxyless workload has no Envoy to take its data-plane certificate over SDS, so this does
it for it: an ADS stream to proxy-cp, authenticated by the proxy certificate (mTLS, the
bootstrap's channel credentials), asking for the identity's two secrets
(``service-cert`` and ``mesh-trust-bundle``, the only ones proxy-cp serves a proxy), and
each version written to the folder's ``cert.pem``, ``key.pem`` (0600) and ``ca.pem`` by
``rename`` (the key first, then the certificate), then ACKed. gRPC's ``file_watcher``
picks the new files up; nothing restarts.

:func:`fetch_once` is ``trellis grpc bootstrap``'s first fetch; :func:`follow` is
``trellis grpc agent``: it reconnects with backoff, forever, and says so in its log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import struct_pb2

from trellis_cli.errors import CliError
from trellis_common.grpc_bootstrap import SERVICE_SECRET, TRUST_BUNDLE_SECRET, GrpcFolder

log = logging.getLogger(__name__)

SECRET_TYPE = "type.googleapis.com/" + secret_pb2.Secret.DESCRIPTOR.full_name


@dataclass(frozen=True, slots=True)
class Material:
    cert_chain_pem: bytes
    key_pem: bytes = field(repr=False)
    trust_bundle_pem: bytes
    version: str


def read_bootstrap(files: GrpcFolder) -> dict[str, Any]:
    try:
        body: dict[str, Any] = json.loads(files.bootstrap.read_text())
        body["xds_servers"][0]["server_uri"]
        body["node"]["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise CliError(
            f"{files.bootstrap} is not a bootstrap of `trellis grpc bootstrap`: {exc!r}"
        ) from None
    return body


def _node(bootstrap: dict[str, Any]) -> base_pb2.Node:
    node = bootstrap["node"]
    metadata = struct_pb2.Struct()
    metadata.update(node.get("metadata") or {})
    return base_pb2.Node(id=node["id"], cluster=node.get("cluster", ""), metadata=metadata)


def _request(
    node: base_pb2.Node | None, version: str = "", nonce: str = ""
) -> discovery_pb2.DiscoveryRequest:
    request = discovery_pb2.DiscoveryRequest(
        type_url=SECRET_TYPE,
        resource_names=[SERVICE_SECRET, TRUST_BUNDLE_SECRET],
        version_info=version,
        response_nonce=nonce,
    )
    if node is not None:
        request.node.CopyFrom(node)
    return request


def _material(response: discovery_pb2.DiscoveryResponse) -> Material | None:
    found: dict[str, secret_pb2.Secret] = {}
    for item in response.resources:
        secret = secret_pb2.Secret()
        item.Unpack(secret)
        found[secret.name] = secret
    mine, trust = found.get(SERVICE_SECRET), found.get(TRUST_BUNDLE_SECRET)
    if mine is None or trust is None:
        return None
    return Material(
        mine.tls_certificate.certificate_chain.inline_bytes,
        mine.tls_certificate.private_key.inline_bytes,
        trust.validation_context.trusted_ca.inline_bytes,
        response.version_info,
    )


def _replace(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` beside ``path``, then move it into place: readers see old or new."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def install(files: GrpcFolder, material: Material) -> None:
    _replace(files.ca, material.trust_bundle_pem, 0o644)
    _replace(files.key, material.key_pem, 0o600)
    _replace(files.cert, material.cert_chain_pem, 0o644)


def _credentials(files: GrpcFolder) -> grpc.ChannelCredentials:
    """mTLS with the proxy certificate, read again at each connection (it is renewed)."""
    return grpc.ssl_channel_credentials(
        files.ca.read_bytes(), files.proxy_key.read_bytes(), files.proxy_cert.read_bytes()
    )


async def _stream(
    files: GrpcFolder,
    bootstrap: dict[str, Any],
    on_material: Callable[[Material], None],
    once: bool,
    timeout: float | None,
) -> None:
    target = bootstrap["xds_servers"][0]["server_uri"]
    queue: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()
    await queue.put(_request(_node(bootstrap)))

    async def requests() -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while (item := await queue.get()) is not None:
            yield item

    async with grpc.aio.secure_channel(target, _credentials(files)) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        call = stub.StreamAggregatedResources(requests(), timeout=timeout)
        try:
            async for response in call:
                material = _material(response)
                if material is not None:
                    on_material(material)
                await queue.put(_request(None, response.version_info, response.nonce))
                if once and material is not None:
                    return
        finally:
            await queue.put(None)
            call.cancel()


def fetch_once(files: GrpcFolder, bootstrap: dict[str, Any], timeout: float = 30.0) -> Material:
    """The workload's certificate, key and CA as proxy-cp serves them now."""
    found: list[Material] = []
    try:
        asyncio.run(_stream(files, bootstrap, found.append, once=True, timeout=timeout))
    except grpc.RpcError as exc:
        raise CliError(
            f"proxy-cp did not serve the workload certificate: {exc.code().name}: {exc.details()}"
        ) from None
    if not found:
        raise CliError("proxy-cp ended the stream before it sent the workload certificate")
    return found[0]


def follow(files: GrpcFolder, max_backoff: float = 30.0) -> None:
    """Keep the workload's files current, forever (``trellis grpc agent``)."""
    bootstrap = read_bootstrap(files)
    failures = 0

    def write(material: Material) -> None:
        nonlocal failures
        install(files, material)
        failures = 0
        log.info("grpc_agent.installed version=%s folder=%s", material.version, files.folder)

    while True:
        try:
            asyncio.run(_stream(files, bootstrap, write, once=False, timeout=None))
            reason = "stream ended"
        except (grpc.RpcError, OSError) as exc:
            reason = repr(exc)
        failures += 1
        delay = min(max_backoff, 0.5 * 2 ** min(failures, 10)) * random.uniform(0.5, 1.0)
        log.warning(
            "grpc_agent.disconnected reason=%s retry_in=%.1fs failures=%d", reason, delay, failures
        )
        asyncio.run(asyncio.sleep(delay))
