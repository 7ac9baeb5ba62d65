"""proxy-cp's side of certmanager: the secret material of identities with proxies.

proxy-cp fetches an identity's certificate when the identity's first proxy connects, for
its trust bundle and serial, and no key: every proxy has its own workload certificate for
its own key, so no service's shared key is sent to any proxy, nor held here.

Changes travel the one event path (``docs/architecture.md``): certmanager signals
``certificates`` (kinds ``issued``, ``rotated``, ``revoked``, ``root-changed``; key: the
common name, ``root`` for the root) and :class:`CertificateFollower` fetches what the
signal names:

* a **proxy** certificate issued or rotated: its metadata (``GetCertificateInfo``, no key),
  and the proxy is then expected with that serial without asking the catalog
  (:meth:`.ExpectedProxies.learned`);
* **revoked** (a proxy's certificate revoked, or rotated away): the common name's revoked
  serials (``ListRevokedCertificates``) go into :class:`~.revoked.RevokedSerials`, and
  ``on_revoked`` ends the streams opened with them (within the signal's delivery time);
* a **service** certificate issued or rotated, of a wanted identity: its material again
  (``IssueCertificate``, idempotent), handed on only if it changed (the serial, or the
  trust bundle), so one rotation rebuilds each of the identity's snapshots once;
* **root-changed**, and every resync: the material of every wanted identity (and, on
  resync, the whole revoked set; streams with a serial revoked meanwhile are ended).

A key that is no common name is rejected (``Health.rejections``, source ``certificates
signal``) and skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_common.ids import InvalidIdentifier, ProxyCommonName, ServiceCommonName
from trellis_proxy_cp.clients import owners
from trellis_proxy_cp.clients.expected import Expectation
from trellis_proxy_cp.clients.revoked import RevokedSerials
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_runtime.events import Follower
from trellis_runtime.health import Health
from trellis_runtime.locate import Locator
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)

T = TypeVar("T")

#: certmanager's topic (its owner's ``TOPIC``).
TOPIC = "certificates"
REJECTED_SIGNAL = "certificates signal"

OnMaterial = Callable[[str, SecretMaterial], Awaitable[None]]
OnProxyIssued = Callable[[str, str, str], None]  # (common name, service account, serial)
OnRevoked = Callable[[str, set[str]], None]  # (common name, its revoked serials)


def material(certificate: pb.Certificate) -> SecretMaterial:
    return SecretMaterial(
        cert_chain_pem=certificate.cert_chain_pem,
        key_pem=certificate.private_key_pem,
        trust_bundle_pem=certificate.trust_bundle_pem,
        serial=certificate.info.serial,
    )


def parse_common_name(text: str) -> ProxyCommonName | ServiceCommonName:
    """A proxy's CN (three labels) or a service's (``...svc.<trust domain>``)."""
    if len(text.split(".")) == 3:
        return ProxyCommonName.parse(text)
    return ServiceCommonName.parse(text)


class CertClient:
    def __init__(
        self,
        locator: Locator,
        on_material: OnMaterial,
        health: Health | None = None,
        on_proxy_issued: OnProxyIssued = lambda common_name, account, serial: None,
        on_revoked: OnRevoked = lambda common_name, serials: None,
        revoked: RevokedSerials | None = None,
    ) -> None:
        self.locator = locator
        self.on_proxy_issued = on_proxy_issued
        self.on_revoked = on_revoked
        self.revoked = revoked if revoked is not None else RevokedSerials()
        self.health = health if health is not None else Health()
        self._on_material = on_material
        self.wanted: dict[str, str] = {}  # identity -> service account
        self.materials: dict[str, SecretMaterial] = {}  # identity -> as last handed out
        self.follower = CertificateFollower(self)

    @property
    def connected(self) -> asyncio.Event:
        """Set while the material is in sync with certmanager."""
        return self.follower.synced

    async def close(self) -> None:
        """Close the channel (a service's runtime closes its locators itself)."""
        await self.locator.close()

    async def _call(self, rpc: Callable[[pb_grpc.CertificateManagerAsyncStub], Awaitable[T]]) -> T:
        return await owners.call(
            self.locator, lambda channel: rpc(pb_grpc.CertificateManagerStub(channel))
        )

    async def issue(self, namespace: str, service: str, account: str) -> SecretMaterial:
        """A service's certificate, without its key: proxies have their own workload
        certificates, so a service's shared key is never sent to one, nor held here."""
        request = pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE,
            service=pb.MeshService(namespace=namespace, name=service),
            service_account=account,
            omit_private_key=True,
        )
        return material(await self._call(lambda stub: stub.IssueCertificate(request, timeout=30)))

    async def info(self, common_name: str) -> pb.CertificateInfo:
        request = pb.GetCertificateRequest(common_name=common_name)
        return await self._call(lambda stub: stub.GetCertificateInfo(request, timeout=10))

    async def issued(self, common_name: str) -> Expectation | None:
        """What certmanager issued to proxy ``common_name``: its account and current serial,
        else None (:attr:`.ExpectedProxies.ask_issuer`)."""
        try:
            info = await self.info(common_name)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return None
        return Expectation(info.service_account, info.serial)

    async def list_revoked(self, common_name: str = "") -> list[pb.RevokedCertificate]:
        request = pb.ListRevokedCertificatesRequest(common_name=common_name)
        answer = await self._call(lambda stub: stub.ListRevokedCertificates(request, timeout=10))
        return list(answer.revoked)

    async def renew_proxy(self, common_name: str, serial: str, csr_pem: bytes) -> pb.Certificate:
        """A proxy's own certificate renewed for its CSR's key (the proxy presented
        ``serial``; certmanager refuses FAILED_PRECONDITION if that is no longer current)."""
        request = pb.RenewProxyCertificateRequest(
            common_name=common_name, serial=serial, csr_pem=csr_pem
        )
        return await self._call(lambda stub: stub.RenewProxyCertificate(request, timeout=30))

    async def enroll(self, token: str, csr_pem: bytes, service: str) -> pb.EnrolledProxy:
        """A pod's proxy enrolled with its ServiceAccount token (certmanager reviews it)."""
        request = pb.EnrollProxyRequest(token=token, csr_pem=csr_pem, service=service)
        return await self._call(lambda stub: stub.EnrollProxy(request, timeout=30))

    async def want(self, identity: str, service_account: str) -> SecretMaterial:
        namespace, service = identity.split("/", 1)
        self.wanted[identity] = service_account
        found = await self.issue(namespace, service, service_account)
        self.materials[identity] = found
        return found

    def forget(self, identity: str) -> None:
        self.wanted.pop(identity, None)
        self.materials.pop(identity, None)

    async def refresh(self, identity: str) -> None:
        """Fetch a wanted identity's material; hand it on if it changed (an RPC error is
        raised)."""
        account = self.wanted.get(identity)
        if account is None:
            return
        before = self.materials.get(identity)
        found = await self.want(identity, account)
        if before is not None and (before.serial, before.trust_bundle_pem) == (
            found.serial,
            found.trust_bundle_pem,
        ):
            return
        log.info("certs.material_changed identity=%s serial=%s", identity, found.serial)
        await self.health.rejections.guarded(
            "certmanager material", identity, self._on_material(identity, found)
        )


class CertificateFollower(Follower):
    """The ``certificates`` topic: what certmanager issued or rotated (module docstring)."""

    topics = (TOPIC,)

    def __init__(self, client: CertClient) -> None:
        super().__init__("certmanager certificates")
        self.client = client

    async def resync(self, topic: str) -> None:
        revoked = await self.client.list_revoked()
        self.client.revoked.replace_all((r.serial, r.common_name) for r in revoked)
        for name in sorted({r.common_name for r in revoked}):  # revoked while we were away
            self.client.on_revoked(name, self.client.revoked.of(name))
        for identity in list(self.client.wanted):  # whatever rotated while we were away
            await self.client.refresh(identity)

    async def changed(self, event: Event) -> None:
        if event.kind == "root-changed":
            log.info("certs.root_changed action=refetch identities=%d", len(self.client.wanted))
            await self.resync(event.topic)
            return
        if event.kind not in ("issued", "rotated", "revoked"):
            self._reject(event, f"unknown kind {event.kind!r}")
            return
        try:
            name = parse_common_name(event.key)
        except InvalidIdentifier as exc:
            self._reject(event, str(exc))
            return
        if isinstance(name, ProxyCommonName):
            if event.kind == "revoked":
                await self._proxy_revoked(name.format())
            else:
                await self._proxy_issued(name.format())
            return
        if event.kind == "revoked":
            self._reject(event, "only proxy certificates are revoked")
            return
        identity = f"{name.namespace}/{name.service}"
        if identity in self.client.wanted:
            await self.client.refresh(identity)

    async def _proxy_issued(self, common_name: str) -> None:
        issued = await self.client.issued(common_name)
        if issued is None:
            log.info("certs.proxy_gone cn=%s", common_name)  # pruned since: nothing to learn
            return
        self.client.on_proxy_issued(common_name, issued.account, issued.serial)

    async def _proxy_revoked(self, common_name: str) -> None:
        listed = await self.client.list_revoked(common_name)
        new = self.client.revoked.add(common_name, (r.serial for r in listed))
        log.info(
            "certs.proxy_revoked cn=%s serials=%s new=%d",
            common_name,
            ",".join(sorted(r.serial for r in listed)) or "-",
            len(new),
        )
        self.client.on_revoked(common_name, self.client.revoked.of(common_name))

    def _reject(self, event: Event, reason: str) -> None:
        log.warning(
            "certs.signal_rejected kind=%s key=%r sender=%s reason=%r",
            event.kind,
            event.key,
            event.sender,
            reason,
        )
        self.client.health.rejections.reject(REJECTED_SIGNAL, event.key, reason)
