"""proxy-cp's side of certmanager: the secret material of identities with proxies.

proxy-cp is the one service that holds service keys beyond certmanager: it fetches an
identity's certificate (with its key) when the identity's first proxy connects, keeps it
in memory only, and sends it over SDS to that identity's proxies alone. Rotations arrive
on certmanager's watch stream; the new material is fetched and handed on. proxy-cp's own
serving certificate (for the xDS port) is issued the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, Awaitable, Callable

import grpc

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_common.follow import StreamFollower, describe
from trellis_common.health import Health
from trellis_proxy_cp.translate.secrets import SecretMaterial

log = logging.getLogger(__name__)

OnMaterial = Callable[[str, SecretMaterial], Awaitable[None]]


def material(certificate: pb.Certificate) -> SecretMaterial:
    return SecretMaterial(
        cert_chain_pem=certificate.cert_chain_pem,
        key_pem=certificate.private_key_pem,
        trust_bundle_pem=certificate.trust_bundle_pem,
        serial=certificate.info.serial,
    )


class CertClient:
    def __init__(
        self,
        address: str,
        on_material: OnMaterial,
        health: Health | None = None,
        on_proxy_issued: Callable[[str, str], None] = lambda common_name, account: None,
    ) -> None:
        self.address = address
        self.on_proxy_issued = on_proxy_issued  # (common name, service account)
        self.health = health if health is not None else Health()
        self._on_material = on_material
        self._channel = grpc.aio.insecure_channel(address)
        self._stub: pb_grpc.CertificateManagerAsyncStub = pb_grpc.CertificateManagerStub(
            self._channel
        )
        self.wanted: dict[str, str] = {}  # identity -> service account
        self.serials: dict[str, str] = {}
        self.connected = asyncio.Event()

    async def close(self) -> None:
        await self._channel.close()

    async def issue(self, namespace: str, service: str, account: str) -> SecretMaterial:
        certificate = await self._stub.IssueCertificate(
            pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_SERVICE,
                service=pb.MeshService(namespace=namespace, name=service),
                service_account=account,
            ),
            timeout=30,
        )
        return material(certificate)

    async def want(self, identity: str, service_account: str) -> SecretMaterial:
        namespace, service = identity.split("/", 1)
        self.wanted[identity] = service_account
        found = await self.issue(namespace, service, service_account)
        self.serials[identity] = found.serial
        return found

    def forget(self, identity: str) -> None:
        self.wanted.pop(identity, None)
        self.serials.pop(identity, None)

    async def run(self, stop: asyncio.Event) -> None:
        await _RotationFollower(self).run(stop)

    async def _refresh(self, identity: str) -> None:
        account = self.wanted.get(identity)
        if account is None:
            return
        found = await self.want(identity, account)  # an RPC error ends the session
        try:
            await self._on_material(identity, found)
        except Exception as exc:  # one identity's material never stops the others
            log.exception("certs.material_failed identity=%s", identity)
            self.health.rejections.reject("certmanager material", identity, describe(exc))
            return
        self.health.rejections.accept("certmanager material", identity)


class _RotationFollower(StreamFollower[pb.CertificateEvent]):
    """``WatchCertificates``: refetch the material of each wanted identity that rotated."""

    def __init__(self, client: CertClient) -> None:
        super().__init__(f"certmanager rotations {client.address}", client.health.loops)
        self.client = client

    def open(self) -> AsyncIterable[pb.CertificateEvent]:
        return self.client._stub.WatchCertificates(pb.WatchCertificatesRequest())

    async def resync(self, first: pb.CertificateEvent) -> None:
        for identity in list(self.client.wanted):  # whatever rotated while we were away
            await self.client._refresh(identity)
        self.client.connected.set()

    async def apply(self, event: pb.CertificateEvent) -> None:
        info = event.info
        if info.kind == pb.CERTIFICATE_KIND_PROXY and event.kind == pb.CertificateEvent.ISSUED:
            self.client.on_proxy_issued(info.common_name, info.service_account)
            return
        if info.kind != pb.CERTIFICATE_KIND_SERVICE:
            return
        identity = f"{info.service.namespace}/{info.service.name}"
        if identity in self.client.wanted and info.serial != self.client.serials.get(identity):
            log.info("certs.rotated identity=%s serial=%s", identity, info.serial)
            await self.client._refresh(identity)

    def lost(self) -> None:
        self.client.connected.clear()
