"""The catalog's side of certmanager: service certificates for the identities with proxies.

The design's Mesh Catalog asks the Certificate Manager for a certificate for every service
that joins. Both parts reach certmanager through one :class:`~trellis_runtime.locate.Locator`
(its configured address, else the registry):

* :class:`CertificateFollower` is the catalog's follower of the ``certificates`` topic (one
  event path: certmanager signals, the catalog fetches). Its resync reads the root's
  fingerprint and lists the proxy certificates on record, and marks exactly those proxies
  expected, each with its current serial (which keeps "expected proxies" durable across
  catalog restarts, and forgets proxies whose records certmanager pruned or revoked). On
  ``issued``/``rotated`` it fetches that certificate's metadata: a proxy certificate makes
  its proxy expected (with the new serial), a service certificate goes into its identity's
  view; ``root-changed`` and ``revoked`` (rare: an operator's revocation, a proxy
  certificate's rotation) resync.
* :class:`CertificateIssuer` issues (idempotently) the service certificate of every identity
  with proxies, and puts its reference (common name, serial) in its view. It asks again
  every 30 s: certmanager keeps rotating a service certificate only while someone asks
  for it (``trellis_certmanager.manager``), so this is that interest, not a poll.

Every record from certmanager is validated again here: one with a malformed common name or
service account (say, stored by an older certmanager) is rejected with its reason and
skipped; the others flow.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog, CertificateRef, UnknownProxy
from trellis_catalog.domain.model.views import Identity
from trellis_common import ids
from trellis_runtime import lifecycle
from trellis_runtime.events import Follower
from trellis_runtime.follow import follow_forever
from trellis_runtime.health import Health, Rejections
from trellis_runtime.locate import Locator
from trellis_runtime.signaling import Event

log = logging.getLogger(__name__)

SOURCE = "certmanager"
#: certmanager's topic and the kinds of its signals (key: the certificate's common name).
TOPIC = "certificates"
ISSUED, ROTATED, REVOKED, ROOT_CHANGED = "issued", "rotated", "revoked", "root-changed"
#: How often the issuer re-asks for every service certificate (see the module docstring).
REISSUE_INTERVAL = 30.0


async def _stub(locator: Locator) -> pb_grpc.CertificateManagerAsyncStub:
    stub: pb_grpc.CertificateManagerAsyncStub = pb_grpc.CertificateManagerStub(
        await locator.channel()
    )
    return stub


class CertificateFollower(Follower):
    """Expected proxies and service certificates, as certmanager's records say."""

    topics = (TOPIC,)

    def __init__(self, catalog: Catalog, locator: Locator, rejections: Rejections) -> None:
        super().__init__("certmanager")
        self.catalog = catalog
        self.locator = locator
        self._rejections = rejections
        self.fingerprint = ""

    async def resync(self, topic: str) -> None:
        stub = await _stub(self.locator)
        try:
            root = await stub.GetRoot(pb.GetRootRequest(), timeout=10)
            proxies = await stub.ListCertificates(
                pb.ListCertificatesRequest(kind=pb.CERTIFICATE_KIND_PROXY), timeout=30
            )
        except grpc.aio.AioRpcError as exc:
            self.locator.failed(exc)
            raise
        self.fingerprint = root.fingerprint_sha256
        listed = [info.common_name for info in proxies.certificates if self._expect(info)]
        self.catalog.expect_only(listed)
        self.catalog.certs_wanted.set()
        log.info("certs.synced proxies=%d root=%s", len(listed), self.fingerprint[:16])

    async def changed(self, event: Event) -> None:
        if event.kind in (ROOT_CHANGED, REVOKED):
            await self.resync(event.topic)
            return
        if event.kind not in (ISSUED, ROTATED):
            log.debug("certs.ignored kind=%s cn=%s", event.kind, event.key)
            return
        stub = await _stub(self.locator)
        try:
            info = await stub.GetCertificateInfo(
                pb.GetCertificateRequest(common_name=event.key), timeout=10
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                log.debug("certs.gone cn=%s", event.key)  # pruned since: nothing to follow
                return
            self.locator.failed(exc)
            raise
        if info.kind == pb.CERTIFICATE_KIND_PROXY:
            self._expect(info)
        elif info.kind == pb.CERTIFICATE_KIND_SERVICE:
            self._service_certificate(info)

    def _service_certificate(self, info: pb.CertificateInfo) -> None:
        try:
            identity = Identity(
                ids.validate_dns_label(info.service.namespace, "service.namespace"),
                ids.validate_dns_label(info.service.name, "service.name"),
            )
        except ids.InvalidIdentifier as exc:
            self._rejections.reject(SOURCE, info.common_name, str(exc))
            return
        self._rejections.accept(SOURCE, info.common_name)
        if identity in self.catalog.identities_with_proxies():
            self.catalog.set_certificate(
                identity, CertificateRef(info.common_name, info.serial, self.fingerprint)
            )

    def _expect(self, info: pb.CertificateInfo) -> bool:
        """Mark a proxy certificate's proxy expected; reject a malformed record."""
        key = f"proxy {info.common_name}"
        try:
            self.catalog.expect_proxy(
                info.common_name, info.service_account, info.not_after.ToSeconds(), info.serial
            )
        except UnknownProxy as exc:
            self._rejections.reject(SOURCE, key, str(exc))
            return False
        self._rejections.accept(SOURCE, key)
        return True


class CertificateIssuer:
    """Issues the service certificate of every identity with proxies, and re-asks."""

    def __init__(
        self,
        catalog: Catalog,
        locator: Locator,
        health: Health,
        follower: CertificateFollower,
        interval: float = REISSUE_INTERVAL,
    ) -> None:
        self.catalog = catalog
        self.locator = locator
        self._health = health
        self._follower = follower
        self._interval = interval

    async def run(self, stop: asyncio.Event) -> None:
        loop = self._health.loops.register("certmanager issuance")

        async def session() -> None:
            while not stop.is_set():
                if not self._follower.synced.is_set():
                    # the trust bundle's fingerprint comes with the follower's resync
                    await lifecycle.first(self._follower.synced.wait(), stop.wait())
                    continue
                self.catalog.certs_wanted.clear()
                try:
                    await self._issue_all(await _stub(self.locator))
                except grpc.aio.AioRpcError as exc:
                    self.locator.failed(exc)
                    raise
                loop.up()
                await lifecycle.first(
                    self.catalog.certs_wanted.wait(),
                    stop.wait(),
                    asyncio.sleep(self._interval),
                )

        await follow_forever(session, stop, what="certmanager issuance", loop=loop)

    async def _issue_all(self, stub: pb_grpc.CertificateManagerAsyncStub) -> None:
        settings = self.catalog.spec.settings
        lifetime = settings.service_cert_validity if settings else None
        for identity, account in sorted(self.catalog.identities_with_proxies().items()):
            current = self.catalog.certificates.get(identity)
            request = pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_SERVICE,
                service=pb.MeshService(namespace=identity.namespace, name=identity.service),
                service_account=account,
                omit_private_key=True,
            )
            if lifetime is not None:  # MeshConfig spec.certificate.serviceCertValidityDuration
                request.validity.FromTimedelta(lifetime)
            try:
                certificate = await stub.IssueCertificate(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.INVALID_ARGUMENT:
                    raise
                # certmanager refuses this identity: report it, issue the others
                self._health.rejections.reject(
                    SOURCE, f"service certificate {identity}", exc.details() or ""
                )
                continue
            self._health.rejections.accept(SOURCE, f"service certificate {identity}")
            expected = self.catalog.builder().trust_domain
            if certificate.info.uris and not certificate.info.uris[0].startswith(
                f"spiffe://{expected}/"
            ):
                log.error(
                    "certs.trust_domain_mismatch identity=%s certificate=%s catalog=%s "
                    "action='set the same trust domain in MeshConfig and certmanager'",
                    identity,
                    certificate.info.uris[0],
                    expected,
                )
            ref = CertificateRef(
                certificate.info.common_name, certificate.info.serial, self._follower.fingerprint
            )
            if ref != current:
                self.catalog.set_certificate(identity, ref)
