"""The ``trellis.certmanager.v1.CertificateManager`` gRPC servicer.

Maps the protobuf API onto :class:`~trellis_certmanager.manager.CertificateManager`, and
domain errors onto status codes: InvalidRequest is INVALID_ARGUMENT naming the field,
NotFound is NOT_FOUND. Keys leave only in the answer to the caller that asked for them.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.domain.errors import InvalidRequest, NotFound
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.manager import CertificateManager
from trellis_common.fanout import WatchOverflow
from trellis_common.ids import InvalidIdentifier
from trellis_common.model import MeshService

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CertificateManager"].full_name

_KINDS = {
    CertificateKind.SERVICE: pb.CERTIFICATE_KIND_SERVICE,
    CertificateKind.PROXY: pb.CERTIFICATE_KIND_PROXY,
}
_CHANGES = {
    "issued": pb.CertificateEvent.ISSUED,
    "rotated": pb.CertificateEvent.ROTATED,
    "root-changed": pb.CertificateEvent.ROOT_CHANGED,
}


def _ts(value: dt.datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def info(record: CertificateRecord) -> pb.CertificateInfo:
    return pb.CertificateInfo(
        common_name=record.common_name,
        kind=_KINDS[record.kind],
        serial=f"{record.serial:x}",
        not_before=_ts(record.not_before),
        not_after=_ts(record.not_after),
        renew_after=_ts(record.renew_after),
        dns_names=record.dns_names,
        uris=record.uris,
        service=pb.MeshService(namespace=record.namespace, name=record.service),
        service_account=record.service_account,
        proxy_id=record.proxy_id,
        issuer=record.issuer,
        fingerprint_sha256=record.fingerprint,
    )


class CertificateManagerServicer(pb_grpc.CertificateManagerServicer):
    def __init__(self, manager: CertificateManager) -> None:
        self._manager = manager

    def _certificate(self, record: CertificateRecord, with_key: bool = True) -> pb.Certificate:
        return pb.Certificate(
            info=info(record),
            cert_chain_pem=record.cert_chain_pem,
            private_key_pem=record.key_pem if with_key else b"",
            trust_bundle_pem=self._manager.ca.trust_bundle_pem,
        )

    async def IssueCertificate(
        self, request: pb.IssueCertificateRequest, context: Context
    ) -> pb.Certificate:
        try:
            if not request.HasField("service"):
                raise InvalidRequest("service", "is required")
            service = MeshService(request.service.namespace, request.service.name)
            validity = request.validity.ToTimedelta() if request.HasField("validity") else None
            if request.kind == pb.CERTIFICATE_KIND_SERVICE:
                record = await self._manager.issue_service(
                    service, request.service_account, validity
                )
            elif request.kind == pb.CERTIFICATE_KIND_PROXY:
                record = await self._manager.issue_proxy(
                    service, request.proxy_id, request.service_account, validity
                )
            else:
                raise InvalidRequest(
                    "kind", "must be CERTIFICATE_KIND_SERVICE or CERTIFICATE_KIND_PROXY"
                )
        except (InvalidRequest, InvalidIdentifier) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return self._certificate(record, with_key=not request.omit_private_key)

    async def GetCertificate(
        self, request: pb.GetCertificateRequest, context: Context
    ) -> pb.Certificate:
        try:
            return self._certificate(self._manager.get(request.common_name))
        except NotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    async def RotateCertificate(
        self, request: pb.RotateCertificateRequest, context: Context
    ) -> pb.Certificate:
        try:
            return self._certificate(await self._manager.rotate(request.common_name))
        except NotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))

    async def GetRoot(self, request: pb.GetRootRequest, context: Context) -> pb.RootBundle:
        ca = self._manager.ca
        return pb.RootBundle(
            trust_bundle_pem=ca.trust_bundle_pem,
            fingerprint_sha256=ca.fingerprint,
            subject=ca.roots[0].subject.rfc4514_string(),
            not_after=_ts(ca.roots[0].not_valid_after_utc),
            origin=ca.origin,
        )

    async def ListCertificates(
        self, request: pb.ListCertificatesRequest, context: Context
    ) -> pb.ListCertificatesResponse:
        kind = {
            pb.CERTIFICATE_KIND_SERVICE: CertificateKind.SERVICE,
            pb.CERTIFICATE_KIND_PROXY: CertificateKind.PROXY,
        }.get(request.kind)
        records = self._manager.list(kind, request.namespace)
        return pb.ListCertificatesResponse(
            certificates=[info(r) for r in records], revision=self._manager.revision
        )

    async def WatchCertificates(
        self, request: pb.WatchCertificatesRequest, context: Context
    ) -> AsyncIterator[pb.CertificateEvent]:
        changes = self._manager.watch()
        # The first message tells the watcher where it stands; it re-lists if it must.
        yield pb.CertificateEvent(
            kind=pb.CertificateEvent.SNAPSHOT, revision=self._manager.revision
        )
        try:
            async for change in changes:
                yield pb.CertificateEvent(
                    kind=_CHANGES[change.kind],
                    common_name=change.common_name,
                    revision=change.revision,
                    info=info(change.record) if change.record else None,
                )
        except WatchOverflow as exc:
            log.warning("watch.overflow peer=%s", context.peer())
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        finally:
            await changes.aclose()
