"""The catalog's side of certmanager: service certificates for the identities with proxies.

The design's Mesh Catalog asks the Certificate Manager for a certificate for every service
that joins. Here two loops share one channel:

* :class:`CertificateFollower` follows certmanager's watch stream. On (re)connect it lists
  the proxy certificates on record and marks exactly those proxies expected (which keeps
  "expected proxies" durable across catalog restarts, and forgets proxies whose records
  certmanager pruned); later ISSUED events add proxies, and service-certificate events
  bump the views they touch.
* :class:`CertificateIssuer` issues (idempotently) the service certificate of every identity
  with proxies, and puts its reference (common name, serial) in its view.

Every record from certmanager is validated again here: one with a malformed common name or
service account (say, stored by an older certmanager) is rejected with its reason and
skipped; the others flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Coroutine
from typing import Any

import grpc

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog, CertificateRef, UnknownProxy
from trellis_catalog.domain.views import Identity
from trellis_common import ids
from trellis_common.follow import StreamFollower, follow_forever
from trellis_common.health import Health

log = logging.getLogger(__name__)

SOURCE = "certmanager"


class CertificateFollower(StreamFollower[pb.CertificateEvent]):
    def __init__(self, catalog: Catalog, address: str, health: Health) -> None:
        super().__init__("certmanager watch", health.loops)
        self.catalog = catalog
        self.address = address
        self._rejections = health.rejections
        self._stub: pb_grpc.CertificateManagerAsyncStub | None = None
        self.fingerprint = ""

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        async with grpc.aio.insecure_channel(self.address) as channel:
            self._stub = pb_grpc.CertificateManagerStub(channel)
            yield

    def open(self) -> AsyncIterable[pb.CertificateEvent]:
        assert self._stub is not None
        return self._stub.WatchCertificates(pb.WatchCertificatesRequest())

    async def resync(self, first: pb.CertificateEvent) -> None:
        assert self._stub is not None
        root = await self._stub.GetRoot(pb.GetRootRequest(), timeout=10)
        self.fingerprint = root.fingerprint_sha256
        proxies = await self._stub.ListCertificates(
            pb.ListCertificatesRequest(kind=pb.CERTIFICATE_KIND_PROXY), timeout=30
        )
        listed = [info.common_name for info in proxies.certificates if self._expect(info)]
        self.catalog.expect_only(listed)
        self.catalog.certs_wanted.set()

    async def apply(self, event: pb.CertificateEvent) -> None:
        info = event.info
        if info.kind == pb.CERTIFICATE_KIND_PROXY and event.kind == pb.CertificateEvent.ISSUED:
            self._expect(info)
        elif info.kind == pb.CERTIFICATE_KIND_SERVICE:
            try:
                identity = Identity(
                    ids.validate_dns_label(info.service.namespace, "service.namespace"),
                    ids.validate_dns_label(info.service.name, "service.name"),
                )
            except ids.InvalidIdentifier as exc:
                self._rejections.reject(SOURCE, info.common_name, str(exc))
                return
            if identity in self.catalog.identities_with_proxies():
                self.catalog.set_certificate(
                    identity, CertificateRef(info.common_name, info.serial, self.fingerprint)
                )

    def _expect(self, info: pb.CertificateInfo) -> bool:
        """Mark a proxy certificate's proxy expected; reject a malformed record."""
        key = f"proxy {info.common_name}"
        try:
            self.catalog.expect_proxy(
                info.common_name, info.service_account, info.not_after.ToSeconds()
            )
        except UnknownProxy as exc:
            self._rejections.reject(SOURCE, key, str(exc))
            return False
        self._rejections.accept(SOURCE, key)
        return True


async def _first(*waits: Coroutine[Any, Any, Any]) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


class CertificateIssuer:
    """Issues the service certificate of every identity with proxies, and re-checks."""

    def __init__(
        self, catalog: Catalog, address: str, health: Health, follower: CertificateFollower
    ) -> None:
        self.catalog = catalog
        self.address = address
        self._health = health
        self._follower = follower

    async def run(self, stop: asyncio.Event) -> None:
        loop = self._health.loops.register("certmanager issuance")

        async def session() -> None:
            async with grpc.aio.insecure_channel(self.address) as channel:
                stub: pb_grpc.CertificateManagerAsyncStub = pb_grpc.CertificateManagerStub(channel)
                while not stop.is_set():
                    if not self._follower.synced.is_set():
                        # the trust bundle's fingerprint comes with the follower's resync
                        await _first(self._follower.synced.wait(), stop.wait())
                        continue
                    self.catalog.certs_wanted.clear()
                    await self._issue_all(stub)
                    loop.up()
                    waiter = asyncio.create_task(self.catalog.certs_wanted.wait())
                    stopper = asyncio.create_task(stop.wait())
                    # re-check now and then: a certificate's renewal point may have passed
                    await asyncio.wait(
                        {waiter, stopper}, timeout=30, return_when=asyncio.FIRST_COMPLETED
                    )
                    waiter.cancel()
                    stopper.cancel()

        await follow_forever(session, stop, what=f"certmanager {self.address}", loop=loop)

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
