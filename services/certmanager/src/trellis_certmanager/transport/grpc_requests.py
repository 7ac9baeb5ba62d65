"""What each ``CertificateManager`` RPC accepts: checked values, or ``InvalidField``.

One pure function per RPC with fields, so the rules are read (and fuzzed) apart from the
servicer. Names follow :mod:`trellis_common.ids`: namespaces and service names are DNS
labels, service accounts DNS subdomains (as SMI TrafficTargets name them), proxy ids
canonical UUIDs, common names a proxy's or a service's. A proxy certificate needs a CSR
(``csr_pem``), whose signature and key type are checked here
(:func:`~trellis_certmanager.domain.csr.public_key_from_csr`), as is a proxy's renewal CSR.
Rules that need the CA's settings (the service CN's length with the trust domain) stay in
the issuer, which raises ``InvalidRequest``; the servicer refuses those the same way.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from trellis_api import certmanager_pb2 as pb
from trellis_certmanager.domain.csr import PublicKey, public_key_from_csr
from trellis_certmanager.domain.errors import InvalidRequest
from trellis_certmanager.domain.issuer import MIN_VALIDITY
from trellis_certmanager.domain.records import CertificateKind
from trellis_certmanager.domain.renewal import Renewal
from trellis_common.ids import ProxyCommonName, ProxyId
from trellis_common.model import MeshService
from trellis_runtime import grpcrequests as check

_ISSUED_KINDS: Final[Mapping[int, str]] = {
    pb.CERTIFICATE_KIND_SERVICE: "CERTIFICATE_KIND_SERVICE",
    pb.CERTIFICATE_KIND_PROXY: "CERTIFICATE_KIND_PROXY",
}
_LISTED_KINDS: Final[Mapping[int, str]] = {
    pb.CERTIFICATE_KIND_UNSPECIFIED: "CERTIFICATE_KIND_UNSPECIFIED (all)",
    **_ISSUED_KINDS,
}
_KINDS: Final = {
    pb.CERTIFICATE_KIND_SERVICE: CertificateKind.SERVICE,
    pb.CERTIFICATE_KIND_PROXY: CertificateKind.PROXY,
}
MAX_VALIDITY: Final = dt.timedelta(days=3650)  # as the issuer checks it
_ANY_PROXY: Final = ProxyId("00000000-0000-0000-0000-000000000000")
_NANOS: Final = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Issue:
    kind: CertificateKind
    service: MeshService
    service_account: str  # "" means the service's name
    proxy_id: str  # "" means "make one" (proxy certificates only)
    validity: dt.timedelta | None  # None means the default for the kind
    omit_private_key: bool
    public_key: PublicKey | None = None  # the CSR's (proxy certificates); None: make a key


def _validity(request: pb.IssueCertificateRequest) -> dt.timedelta | None:
    if not request.HasField("validity"):
        return None
    seconds, nanos = request.validity.seconds, request.validity.nanos
    if seconds < 0 or nanos < 0:
        raise check.InvalidField("validity", f"must not be negative, got {seconds}s {nanos}ns")
    if nanos >= _NANOS:
        raise check.InvalidField("validity", f"nanos must be below {_NANOS}, got {nanos}")
    if seconds == 0 and nanos == 0:
        return None  # zero: the default for the kind
    if seconds > MAX_VALIDITY.total_seconds():
        raise check.InvalidField("validity", f"must be at most {MAX_VALIDITY}, got {seconds}s")
    validity = dt.timedelta(seconds=seconds, microseconds=nanos // 1000)
    if validity < MIN_VALIDITY:
        raise check.InvalidField("validity", f"must be at least {MIN_VALIDITY}, got {validity}")
    return validity


def issue(request: pb.IssueCertificateRequest) -> Issue:
    check.enum("kind", request.kind, _ISSUED_KINDS)
    kind = _KINDS[request.kind]
    if not request.HasField("service"):
        raise check.InvalidField("service", "is required")
    namespace = check.dns_label("service.namespace", request.service.namespace)
    name = check.dns_label("service.name", request.service.name)
    account = check.service_account("service_account", request.service_account)
    public_key: PublicKey | None = None
    if kind is CertificateKind.PROXY:
        proxy_id = check.proxy_id("proxy_id", request.proxy_id, optional=True)
        try:
            ProxyCommonName(_ANY_PROXY, name, namespace)
        except ValueError as exc:  # the CN's 64 characters: the names are too long together
            raise check.InvalidField("service", str(exc)) from None
        if not request.csr_pem:
            raise check.InvalidField(
                "csr_pem",
                "is required for CERTIFICATE_KIND_PROXY: the proxy makes its key on its own "
                "host and sends a PEM certificate signing request",
            )
        try:
            public_key = public_key_from_csr(request.csr_pem, "csr_pem")
        except InvalidRequest as exc:
            raise check.InvalidField(exc.field, exc.reason) from None
    elif request.proxy_id:
        raise check.InvalidField("proxy_id", "only proxy certificates have a proxy id")
    elif request.csr_pem:
        raise check.InvalidField(
            "csr_pem", "only proxy certificates are issued for a CSR (service keys are made here)"
        )
    else:
        proxy_id = ""
    return Issue(
        kind,
        MeshService(namespace, name),
        account,
        proxy_id,
        _validity(request),
        request.omit_private_key,
        public_key,
    )


def common_name(request: pb.GetCertificateRequest | pb.RotateCertificateRequest) -> str:
    check.common_name("common_name", request.common_name)
    return request.common_name


def renew_proxy(request: pb.RenewProxyCertificateRequest) -> tuple[str, Renewal]:
    """A proxy's common name and its renewal: the serial it presented, its CSR's key."""
    check.common_name("common_name", request.common_name)
    try:
        ProxyCommonName.parse(request.common_name)
    except ValueError as exc:
        raise check.InvalidField("common_name", str(exc)) from None
    try:
        serial = int(request.serial, 16)
    except ValueError:
        raise check.InvalidField(
            "serial", f"must be the presented certificate's serial in hex, got {request.serial!r}"
        ) from None
    try:
        public_key = public_key_from_csr(request.csr_pem, "csr_pem")
    except InvalidRequest as exc:
        raise check.InvalidField(exc.field, exc.reason) from None
    return request.common_name, Renewal(serial, public_key)


def list_filter(request: pb.ListCertificatesRequest) -> tuple[CertificateKind | None, str]:
    check.enum("kind", request.kind, _LISTED_KINDS)
    namespace = check.dns_label("namespace", request.namespace, optional=True)
    return _KINDS.get(request.kind), namespace


def revoked_filter(request: pb.ListRevokedCertificatesRequest) -> str:
    """A proxy's common name, or empty (all revocations)."""
    if request.common_name:
        check.common_name("common_name", request.common_name)
    return request.common_name
