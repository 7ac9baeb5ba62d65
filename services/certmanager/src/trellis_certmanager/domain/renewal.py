"""A proxy renewing its own certificate: what it presented, and the key it wants certified.

A renewal is a rotation asked for by the proxy (through proxy-cp, which checked the proxy's
certificate on its mTLS port) that brings a new public key. It is allowed only while the
certificate the proxy presented is still the current one of its common name: two renewals
racing with one certificate, or a renewal with a certificate rotated away meanwhile, get
:class:`~.errors.StaleCertificate` rather than a second live certificate.
"""

from __future__ import annotations

from dataclasses import dataclass

from trellis_certmanager.domain.csr import PublicKey
from trellis_certmanager.domain.errors import InvalidRequest, StaleCertificate
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord


@dataclass(frozen=True, slots=True)
class Renewal:
    serial: int
    """The serial of the certificate the proxy presented."""
    public_key: PublicKey
    """The key of the proxy's CSR (its signature already checked)."""

    def checked(self, current: CertificateRecord) -> PublicKey:
        """The key to certify; raises unless ``current`` is a proxy certificate with the
        presented serial."""
        if current.kind != CertificateKind.PROXY:
            raise InvalidRequest("common_name", "only proxy certificates are renewed this way")
        if current.serial != self.serial:
            raise StaleCertificate(current.common_name, self.serial, current.serial)
        return self.public_key
