"""The catalog's side of certmanager: service certificates for the identities with proxies.

The design's Mesh Catalog asks the Certificate Manager for a certificate for every service
that joins. Here: each identity with a proxy gets its service certificate issued (an
idempotent call) and its reference (common name, serial) put in its view; rotations come
over certmanager's watch stream and bump the views they touch. Proxy certificates on record
are the proxies certmanager issued for: on (re)connect they are all marked expected, which
keeps "expected proxies" durable across catalog restarts.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_catalog.catalog import Catalog, CertificateRef, UnknownProxy
from trellis_catalog.domain.views import Identity
from trellis_common.follow import follow_forever
from trellis_common.health import Rejections

log = logging.getLogger(__name__)


class CertificateFollower:
    def __init__(
        self, catalog: Catalog, address: str, rejections: Rejections | None = None
    ) -> None:
        self.catalog = catalog
        self.address = address
        self.rejections = rejections if rejections is not None else Rejections()
        self.synced = asyncio.Event()
        self._fingerprint = ""

    async def run(self, stop: asyncio.Event) -> None:
        async def session() -> None:
            async with grpc.aio.insecure_channel(self.address) as channel:
                await self._follow(pb_grpc.CertificateManagerStub(channel), stop)

        await follow_forever(
            session, stop, what=f"certmanager {self.address}", on_lost=self.synced.clear
        )

    async def _follow(self, stub: pb_grpc.CertificateManagerAsyncStub, stop: asyncio.Event) -> None:
        stream = stub.WatchCertificates(pb.WatchCertificatesRequest())
        events = aiter(stream)
        await anext(events)  # SNAPSHOT
        root = await stub.GetRoot(pb.GetRootRequest(), timeout=10)
        self._fingerprint = root.fingerprint_sha256
        proxies = await stub.ListCertificates(
            pb.ListCertificatesRequest(kind=pb.CERTIFICATE_KIND_PROXY), timeout=30
        )
        for info in proxies.certificates:
            self._expect(info)
        issuer = asyncio.create_task(self._issue_loop(stub, stop))
        self.synced.set()
        stopper = asyncio.create_task(stop.wait())
        try:
            while True:
                reading = asyncio.ensure_future(anext(events))
                await asyncio.wait({reading, stopper, issuer}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    if issuer.done():
                        issuer.result()  # re-raise the RPC error, reconnect
                    return
                event = reading.result()
                info = event.info
                if (
                    info.kind == pb.CERTIFICATE_KIND_PROXY
                    and event.kind == pb.CertificateEvent.ISSUED
                ):
                    self._expect(info)
                elif info.kind == pb.CERTIFICATE_KIND_SERVICE:
                    identity = Identity(info.service.namespace, info.service.name)
                    if identity in self.catalog.identities_with_proxies():
                        self.catalog.set_certificate(
                            identity,
                            CertificateRef(info.common_name, info.serial, self._fingerprint),
                        )
        finally:
            stopper.cancel()
            issuer.cancel()
            stream.cancel()

    def _expect(self, info: pb.CertificateInfo) -> None:
        """Expect the proxy of a proxy certificate; one that cannot be a proxy is refused."""
        try:
            self.catalog.expect_proxy(info.common_name, info.service_account)
        except UnknownProxy as exc:
            self.rejections.reject("certificates", info.common_name, str(exc))
        else:
            self.rejections.accept("certificates", info.common_name)

    async def _issue_loop(
        self, stub: pb_grpc.CertificateManagerAsyncStub, stop: asyncio.Event
    ) -> None:
        """Issue (idempotently) the service certificate of every identity with proxies."""
        while not stop.is_set():
            self.catalog.certs_wanted.clear()
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
                certificate = await stub.IssueCertificate(request, timeout=30)
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
                    certificate.info.common_name, certificate.info.serial, self._fingerprint
                )
                if ref != current:
                    self.catalog.set_certificate(identity, ref)
            waiter = asyncio.create_task(self.catalog.certs_wanted.wait())
            stopper = asyncio.create_task(stop.wait())
            # re-check now and then: a certificate's renewal point may have passed
            await asyncio.wait({waiter, stopper}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
