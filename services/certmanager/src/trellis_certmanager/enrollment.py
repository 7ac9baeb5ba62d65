"""Pod proxies enrolled by their agent, with the pod's own ServiceAccount token.

A pod's agent makes its key in the pod and sends a CSR, with the pod's projected
ServiceAccount token, to proxy-cp's enrollment port; proxy-cp forwards both here
(``EnrollProxy``, which only proxy-cp may call). The API server reviews the token
(:meth:`~trellis_certmanager.tokenreview.ServiceAccountReviewer.workload`): it must be for
audience ``trellis``, bound to a pod that still exists, and not of the control plane's
namespace. Then, for the CSR's key:

- the **proxy certificate**: CN ``<pod-uid>.<service>.<namespace>`` (the proxy's node id
  with proxy-cp), recorded as every proxy certificate is; a new key for the same pod
  revokes the previous serial (reason ``rotated``): one key per proxy;
- the **workload certificate**: the SPIFFE id of the token's ServiceAccount (the pod's own,
  as in OSM and Istio), and the service's DNS names, ending with the proxy certificate.

The service comes from the agent (the injector wrote it) and names the proxy; it grants
nothing: namespace, account and pod are the token's. Every refusal is logged
(``enroll.refused reason=...``) and counted in
``trellis_certmanager_enrollments_refused_total{reason}``; no token or key is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from trellis_certmanager.domain.csr import public_key_from_csr
from trellis_certmanager.domain.errors import InvalidRequest
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.tokenreview import BoundPod, ReviewRefused, ServiceAccountReviewer
from trellis_common.ids import InvalidIdentifier, SpiffeId, validate_dns_label
from trellis_common.model import MeshService

log = logging.getLogger(__name__)


class EnrollmentRefused(Exception):
    """The enrollment is refused; ``reason`` is the metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")  # proxy-cp counts by the reason first
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Enrolled:
    proxy: CertificateRecord
    spiffe_id: str
    pod: BoundPod


class ProxyEnrollment:
    def __init__(
        self,
        manager: CertificateManager,
        reviewer: ServiceAccountReviewer | None,
        registry: CollectorRegistry,
    ) -> None:
        self._manager = manager
        self._reviewer = reviewer
        self.refused = Counter(
            "trellis_certmanager_enrollments_refused",
            "Pod proxy enrollments refused, by reason",
            ["reason"],
            registry=registry,
        )
        self.enrolled = Counter(
            "trellis_certmanager_enrollments",
            "Pod proxies enrolled (first certificates and renewals)",
            registry=registry,
        )

    async def enroll(self, token: str, csr_pem: bytes, service: str) -> Enrolled:
        try:
            return await self._enroll(token, csr_pem, service)
        except ReviewRefused as exc:
            refused = EnrollmentRefused(exc.reason, str(exc))
            self._refuse(refused)
            raise refused from exc
        except EnrollmentRefused as exc:
            self._refuse(exc)
            raise

    def _refuse(self, refused: EnrollmentRefused) -> None:
        self.refused.labels(refused.reason).inc()
        log.warning("enroll.refused reason=%s error=%r", refused.reason, str(refused))

    async def _enroll(self, token: str, csr_pem: bytes, service: str) -> Enrolled:
        reviewer = self._reviewer
        if reviewer is None:
            raise EnrollmentRefused(
                "no_kubernetes", "certmanager has no Kubernetes API to review pod tokens with"
            )
        if not token:
            raise EnrollmentRefused("no_token", "no ServiceAccount token was presented")
        try:
            validate_dns_label(service, "service")
        except InvalidIdentifier as exc:
            raise EnrollmentRefused("bad_service", str(exc)) from exc
        try:
            public_key = public_key_from_csr(csr_pem)
        except InvalidRequest as exc:
            raise EnrollmentRefused("bad_csr", str(exc)) from exc
        pod = await reviewer.workload(token)  # the API server's trouble: StoreUnavailable
        mesh_service = MeshService(pod.namespace, service)
        try:
            record = await self._manager.issue_proxy(
                mesh_service, pod.pod_uid, pod.service_account, public_key=public_key
            )
        except InvalidRequest as exc:
            raise EnrollmentRefused("invalid", str(exc)) from exc
        issuer = self._manager.issuer
        spiffe = SpiffeId(issuer.policy.trust_domain, pod.namespace, pod.service_account)
        self.enrolled.inc()
        log.info(
            "enroll.issued proxy=%s pod=%s/%s account=%s serial=%x not_after=%s",
            record.common_name,
            pod.namespace,
            pod.pod_name,
            pod.service_account,
            record.serial,
            record.not_after.isoformat(),
        )
        return Enrolled(record, spiffe.uri, pod)
