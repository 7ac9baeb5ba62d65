"""Issuing certificates: the current one while it is good, else a new one, once.

An issue request is answered from memory when the certificate held satisfies it, so the
catalog's asks (every 30 s, for each identity with proxies) cost no store round trip and keep
working while Redis is away. Otherwise the new certificate is made under the common name's
claim, on the record stored now (:meth:`~trellis_certmanager.replicas.HeldRecords.current_or`):
concurrent callers, on one replica or several, get one certificate.

A service certificate asked for is noted in the demand (:mod:`trellis_certmanager.demand`):
the rotation pass keeps renewing only what someone still asks for. No service certificate
is issued in the control plane's namespace (ControlPlaneNamespace, logged with the requester
and counted in ``issue_refused``): its names are the components', whose own certificates are
what they serve; main adopts and drops any an earlier version made.

Proxy certificates are issued for a CSR (certmanager never has the key), and a proxy has one
key at a time: asking again for the same key returns the current certificate, and a new key
gets a new certificate while the old serial is revoked (reason ``rotated``), so that nothing
signed for the old key connects any more. An expired one is not revoked: it cannot connect
anyway.
"""

from __future__ import annotations

import datetime as dt

from trellis_certmanager.claims import Claim
from trellis_certmanager.domain.csr import PublicKey, signed_for
from trellis_certmanager.domain.errors import ControlPlaneNamespace, InvalidRequest
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.ledger import CertificateLedger, log
from trellis_common.ids import InvalidIdentifier, ProxyCommonName, ProxyId
from trellis_common.model import MeshService


class Issuance(CertificateLedger):
    """The manager's issue calls (module docstring)."""

    async def issue_service(
        self,
        service: MeshService,
        service_account: str = "",
        validity: dt.timedelta | None = None,
        *,
        requester: str = "-",
    ) -> CertificateRecord:
        """A service certificate (the current one while it is good); none in the control
        plane's namespace (logged with ``requester``, counted, ControlPlaneNamespace)."""
        if self._policy.reserved(service.namespace):
            refused = ControlPlaneNamespace(service.namespace, service.name)
            self._metrics.issue_refused.labels("service", refused.reason).inc()
            log.warning(
                "cert.refused kind=service reason=%s service=%s requester=%s",
                refused.reason,
                service,
                requester,
            )
            raise refused
        account = service_account or service.name
        cn = self.issuer.service_common_name(service)
        self.demand.asked(cn)

        def fits(current: CertificateRecord) -> bool:
            return (
                self._policy.lifetime_fits(current.lifetime, validity)
                and current.service_account == account
                and not current.due(self._clock())
                and self.ca.signed(current.cert_chain_pem)
            )

        async def issue(current: CertificateRecord | None, claim: Claim) -> CertificateRecord:
            record = self._timed(
                CertificateKind.SERVICE,
                lambda: self.issuer.issue_service(service, account, self._clock(), validity),
            )
            change = "issued" if current is None else "rotated"
            await self._commit(record, change, "reissue", claim)
            return record

        return await self._records.current_or(cn, fits, issue)

    async def issue_proxy(
        self,
        service: MeshService,
        proxy_id: str = "",
        service_account: str = "",
        validity: dt.timedelta | None = None,
        *,
        public_key: PublicKey,
    ) -> CertificateRecord:
        """A proxy certificate for ``public_key`` (the proxy's CSR). The current one of the
        same proxy is returned if it is valid and for the same key; for another key a new
        one is issued and the old serial revoked (reason ``rotated``): one key per proxy."""
        try:
            cn = (
                ProxyCommonName(ProxyId(proxy_id), service.name, service.namespace)
                if proxy_id
                else ProxyCommonName.new(service.name, service.namespace)
            )
        except InvalidIdentifier as exc:
            raise InvalidRequest(exc.field.replace(" ", "_"), str(exc)) from exc

        def fits(live: CertificateRecord) -> bool:
            return (
                live.not_after > self._clock()
                and validity is None
                and signed_for(live.cert_chain_pem, public_key)
            )

        async def issue(live: CertificateRecord | None, claim: Claim) -> CertificateRecord:
            account = service_account or service.name
            record = self._timed(
                CertificateKind.PROXY,
                lambda: self.issuer.issue_proxy(
                    cn, account, self._clock(), validity, public_key=public_key
                ),
            )
            await self._commit(record, "issued", "reissue", claim)
            if live is not None and live.not_after > self._clock():  # expired: not revoked
                await self._retire(live, claim)
            return record

        return await self._records.current_or(cn.format(), fits, issue)

    def workload_chain(self, proxy: CertificateRecord) -> bytes:
        """``proxy``'s own workload certificate (PEM chain), signed now (Issuer)."""
        return self.issuer.workload_chain(proxy, self._clock())
