"""The ``trellis.certmanager.v1.CertificateManager`` gRPC servicer.

Maps the protobuf API onto :class:`~trellis_certmanager.manager.CertificateManager`, and
errors onto status codes. Every request is checked first (:mod:`.grpc_requests`); a bad
field, or the domain's InvalidRequest, is refused through the service's
:class:`~trellis_runtime.grpcrequests.RequestGate`: INVALID_ARGUMENT naming the field,
logged, counted and shown in ``/v1/status``. NotFound is NOT_FOUND; a service certificate
asked for in the control plane's namespace is PERMISSION_DENIED (the manager logs and
counts it with the caller's SPIFFE id): its names are the components'. Keys leave only in the
answer to the caller that asked for them, and only service keys: a proxy certificate is
issued for the proxy's CSR, so its record has no key and ``private_key_pem`` is empty.
``GetCertificateInfo``, which consumers call when the ``certificates`` signal rings,
answers metadata only, as does ``ListRevokedCertificates`` (called on the signal's kind
``revoked``). Both, and ``GetCertificate``, read the store (the signal may come from
another replica, and reach the caller first), and memory only while Redis is away.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import grpc
from cryptography import x509
from google.protobuf import timestamp_pb2

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.domain.errors import (
    ControlPlaneNamespace,
    InvalidRequest,
    NotFound,
    StaleCertificate,
    StoreUnavailable,
)
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.domain.renewal import Renewal
from trellis_certmanager.domain.revocation import Revocation
from trellis_certmanager.enrollment import EnrollmentRefused, ProxyEnrollment
from trellis_certmanager.identities import ComponentIssuer
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.transport import grpc_requests
from trellis_common.ids import InvalidIdentifier
from trellis_identity.authz import caller
from trellis_runtime.grpcrequests import InvalidField, RequestGate, rpc
from trellis_runtime.health import Rejections

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CertificateManager"].full_name

#: Domain errors that end a call: NotFound is the caller's, StoreUnavailable is "retry later"
#: (nothing was issued or rotated), StaleCertificate a renewal with a replaced certificate,
#: ControlPlaneNamespace a service certificate that would carry a component's identity.
_STATUSES = {
    NotFound: grpc.StatusCode.NOT_FOUND,
    StoreUnavailable: grpc.StatusCode.UNAVAILABLE,
    StaleCertificate: grpc.StatusCode.FAILED_PRECONDITION,
    ControlPlaneNamespace: grpc.StatusCode.PERMISSION_DENIED,
}

#: A refused enrollment's code, by reason (enrollment.py); any other: the token does not
#: prove what enrolling needs.
_DENIED = grpc.StatusCode.PERMISSION_DENIED
_ENROLL_CODES = {
    "no_kubernetes": grpc.StatusCode.FAILED_PRECONDITION,
    "no_token": grpc.StatusCode.UNAUTHENTICATED,
    "not_authenticated": grpc.StatusCode.UNAUTHENTICATED,
    "wrong_audience": grpc.StatusCode.UNAUTHENTICATED,
    "bad_csr": grpc.StatusCode.INVALID_ARGUMENT,
    "bad_service": grpc.StatusCode.INVALID_ARGUMENT,
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
}

_KINDS = {
    CertificateKind.SERVICE: pb.CERTIFICATE_KIND_SERVICE,
    CertificateKind.PROXY: pb.CERTIFICATE_KIND_PROXY,
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


def revoked(revocation: Revocation) -> pb.RevokedCertificate:
    return pb.RevokedCertificate(
        serial=f"{revocation.serial:x}",
        common_name=revocation.common_name,
        not_after=_ts(revocation.not_after),
        revoked_at=_ts(revocation.revoked_at),
        reason=revocation.reason.value,
    )


def _nothing(request: pb.ListRevokedComponentCertificatesRequest) -> None:
    return None


def _csr(request: pb.RenewComponentCertificateRequest) -> bytes:
    if not request.csr_pem:
        raise InvalidField("csr_pem", "a PEM certificate signing request is required")
    return request.csr_pem


class CertificateManagerServicer(pb_grpc.CertificateManagerServicer):
    def __init__(
        self,
        manager: CertificateManager,
        rejections: Rejections | None = None,
        identities: ComponentIssuer | None = None,
        enrollment: ProxyEnrollment | None = None,
    ) -> None:
        self._manager = manager
        self._identities = identities
        self._enrollment = enrollment
        self.gate = RequestGate(rejections)

    def _certificate(self, record: CertificateRecord, with_key: bool = True) -> pb.Certificate:
        """A record as the API answers it; a proxy's comes with its own workload
        certificate (same key), and never a key."""
        proxy = record.kind == CertificateKind.PROXY
        return pb.Certificate(
            info=info(record),
            cert_chain_pem=record.cert_chain_pem,
            private_key_pem=record.key_pem if with_key and not proxy else b"",
            trust_bundle_pem=self._manager.ca.trust_bundle_pem,
            workload_cert_chain_pem=self._manager.workload_chain(record) if proxy else b"",
        )

    @rpc(
        grpc_requests.issue,
        refused=(InvalidField, InvalidRequest, InvalidIdentifier),
        statuses=_STATUSES,  # StoreUnavailable: nothing was issued, the caller retries later
    )
    async def IssueCertificate(
        self, asked: grpc_requests.Issue, context: Context
    ) -> pb.Certificate:
        if asked.kind is CertificateKind.SERVICE:
            # none in the control plane's namespace (the manager refuses, logs and counts):
            # its names are the components' identities
            requester, _ = caller(context, self._manager.issuer.policy.trust_domain)
            record = await self._manager.issue_service(
                asked.service, asked.service_account, asked.validity, requester=requester
            )
        else:
            assert asked.public_key is not None  # grpc_requests.issue requires the CSR
            record = await self._manager.issue_proxy(
                asked.service,
                asked.proxy_id,
                asked.service_account,
                asked.validity,
                public_key=asked.public_key,
            )
        return self._certificate(record, with_key=not asked.omit_private_key)

    @rpc(grpc_requests.common_name, statuses=_STATUSES)
    async def GetCertificate(self, common_name: str, context: Context) -> pb.Certificate:
        return self._certificate(await self._manager.lookup(common_name, wanted=True))

    @rpc(grpc_requests.common_name, statuses=_STATUSES)
    async def RotateCertificate(self, common_name: str, context: Context) -> pb.Certificate:
        return self._certificate(await self._manager.rotate(common_name))

    @rpc(grpc_requests.renew_proxy, refused=(InvalidField, InvalidRequest), statuses=_STATUSES)
    async def RenewProxyCertificate(
        self, asked: tuple[str, Renewal], context: Context
    ) -> pb.Certificate:
        """A proxy's own certificate, renewed for its new key. Only proxy-cp calls this
        (the policy): it checked, on its mTLS port, that the proxy presented this common
        name's certificate with this serial; the serial is checked again here, under the
        common name's lock, against the current record."""
        common_name, renewal = asked
        return self._certificate(await self._manager.rotate(common_name, "renewed", renewal))

    async def GetRoot(self, request: pb.GetRootRequest, context: Context) -> pb.RootBundle:
        ca = self._manager.ca
        return pb.RootBundle(
            trust_bundle_pem=ca.trust_bundle_pem,
            fingerprint_sha256=ca.fingerprint,
            subject=ca.roots[0].subject.rfc4514_string(),
            not_after=_ts(ca.roots[0].not_valid_after_utc),
            origin=ca.origin,
        )

    @rpc(grpc_requests.list_filter)
    async def ListCertificates(
        self, asked: tuple[CertificateKind | None, str], context: Context
    ) -> pb.ListCertificatesResponse:
        records = self._manager.list(*asked)
        return pb.ListCertificatesResponse(
            certificates=[info(r) for r in records], revision=self._manager.revision
        )

    @rpc(grpc_requests.common_name, statuses=_STATUSES)
    async def GetCertificateInfo(self, common_name: str, context: Context) -> pb.CertificateInfo:
        return info(await self._manager.lookup(common_name))

    @rpc(grpc_requests.revoked_filter)
    async def ListRevokedCertificates(
        self, common_name: str, context: Context
    ) -> pb.ListRevokedCertificatesResponse:
        return pb.ListRevokedCertificatesResponse(
            revoked=[revoked(r) for r in await self._manager.revocations.current(common_name)]
        )

    @rpc(_nothing)
    async def ListRevokedComponentCertificates(
        self, asked: None, context: Context
    ) -> pb.ListRevokedComponentCertificatesResponse:
        certs = self._identities.certs if self._identities is not None else None
        revoked = await certs.current_revoked() if certs is not None else []
        return pb.ListRevokedComponentCertificatesResponse(
            revoked=[
                pb.RevokedComponentCertificate(
                    component=c.component,
                    serial=c.serial,
                    not_after=_ts(dt.datetime.fromtimestamp(c.not_after, dt.UTC)),
                    revoked_at=_ts(dt.datetime.fromtimestamp(c.revoked_at, dt.UTC)),
                )
                for c in sorted(revoked, key=lambda c: c.serial)
            ]
        )

    @rpc(_csr, refused=(InvalidField, InvalidRequest))
    async def RenewComponentCertificate(
        self, csr_pem: bytes, context: Context
    ) -> pb.ComponentCertificate:
        """The caller's own identity, renewed: which component it is comes from its
        certificate (the policy let only components through), never from the request."""
        _, component = caller(context, self._manager.issuer.policy.trust_domain)
        if self._identities is None or not component:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "not a component identity")
        assert self._identities is not None
        issued = await self._identities.renew(component, csr_pem)
        leaf = x509.load_pem_x509_certificate(issued.cert_chain_pem)
        return pb.ComponentCertificate(
            cert_chain_pem=issued.cert_chain_pem,
            trust_bundle_pem=issued.trust_bundle_pem,
            not_after=_ts(leaf.not_valid_after_utc),
        )

    @rpc(lambda request: request, statuses=_STATUSES)
    async def EnrollProxy(
        self, request: pb.EnrollProxyRequest, context: Context
    ) -> pb.EnrolledProxy:
        """A pod's proxy, enrolled by its agent through proxy-cp (``enrollment.py``): who
        the pod is comes from its token, as the API server reviewed it."""
        if self._enrollment is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no pod enrollment here")
        assert self._enrollment is not None
        try:
            enrolled = await self._enrollment.enroll(
                request.token, request.csr_pem, request.service
            )
        except EnrollmentRefused as exc:
            await context.abort(_ENROLL_CODES.get(exc.reason, _DENIED), str(exc))
        pod = enrolled.pod
        proxy = self._certificate(enrolled.proxy, with_key=False)
        return pb.EnrolledProxy(
            proxy=proxy,
            workload_cert_chain_pem=proxy.workload_cert_chain_pem,
            spiffe_id=enrolled.spiffe_id,
            namespace=pod.namespace,
            service_account=pod.service_account,
            pod_name=pod.pod_name,
            pod_uid=pod.pod_uid,
        )
