"""Issuing leaf certificates from the mesh CA.

Service certificates (seed: ~48 h) are shared by the proxies of one service: CN
``<svc>.<ns>.svc.<trust-domain>``, DNS SANs for every name clients use, and the SPIFFE URI of
the service account, which is what TrafficTargets authorize. Each lifetime is randomly
shortened or lengthened by up to ``jitter`` (a fraction) so a fleet issued together does
not renew together: the seed's thundering-herd rule. Proxy certificates are long-lived and
identify one proxy to proxy-cp: CN ``<proxy-uuid>.<service>.<namespace>``; they are signed
for the public key of the proxy's CSR, never for a key made here. Component certificates
are the only leaves in the control plane's namespace (``trellis-system``): a client that
checks a component's DNS name has checked its identity (``trellis_identity.servercheck``).

Each leaf is encoded from this CA's :class:`~trellis_certmanager.domain.template.LeafTemplate`
(what every leaf shares, encoded once) rather than by ``x509.CertificateBuilder``: the
bytes are the same, and building them cost several times the signature.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from trellis_certmanager.domain import der
from trellis_certmanager.domain.authority import CertificateAuthority, fingerprint_der
from trellis_certmanager.domain.csr import PublicKey, leaf_public_key
from trellis_certmanager.domain.errors import ControlPlaneNamespace, InvalidRequest
from trellis_certmanager.domain.keys import KeyAlgorithm, generate_key, key_to_pem
from trellis_certmanager.domain.records import CertificateKind, CertificateRecord
from trellis_certmanager.domain.template import LeafTemplate
from trellis_common import components
from trellis_common.ids import (
    InvalidIdentifier,
    ProxyCommonName,
    ProxyId,
    ServiceCommonName,
    SpiffeId,
    service_dns_names,
)
from trellis_common.model import MeshService

BACKDATE = dt.timedelta(minutes=1)  # tolerate small clock skew between hosts
MIN_VALIDITY = dt.timedelta(minutes=1)


def authority_key_identifier(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    """What leaves name their issuer's key by: the CA's own subjectKeyIdentifier when it has
    one (RFC 5280 4.2.1.1), which is how verifiers find the issuer. It is not always the
    SHA-1 of the key: Go 1.25 (Helm's genCA, cert-manager) writes truncated SHA-256, and a
    leaf with a recomputed one fails with "unable to get local issuer certificate"."""
    try:
        found = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())  # type: ignore[arg-type]
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(found)


@dataclass(frozen=True, slots=True)
class IssuancePolicy:
    """How long certificates live and when they are renewed."""

    service_validity: dt.timedelta = dt.timedelta(hours=48)
    proxy_validity: dt.timedelta = dt.timedelta(hours=24)  # hosts renew (trellis proxy renew)
    jitter: float = 0.1  # +/- fraction of the service validity
    renew_fraction: float = 0.75  # renew once this share of the lifetime has passed
    trust_domain: str = "cluster.local"
    cluster_domain: str = "cluster.local"
    # The control plane's own identities live here, and only they: no proxy may be
    # onboarded into it (a proxy there could pose as proxy-cp) and no service certificate
    # is issued in it (its names would be a component's); component certificates are the
    # only leaves with its names and SPIFFE ids.
    control_plane_namespace: str = "trellis-system"
    # Names (or IP addresses) proxy-cp's component certificate (what its xDS, Destination
    # and enrollment ports serve) carries besides its own names: proxyless gRPC clients
    # check the host of their bootstrap's server_uri against it, with no override (a local
    # run dials localhost). No other certificate carries them.
    proxy_cp_extra_sans: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")

    def __post_init__(self) -> None:
        if not 0 <= self.jitter < 0.5:
            raise InvalidRequest("jitter", f"must be in [0, 0.5), got {self.jitter}")
        if not 0 < self.renew_fraction < 1:
            raise InvalidRequest("renew_fraction", f"must be in (0, 1), got {self.renew_fraction}")
        for name in ("service_validity", "proxy_validity"):
            if getattr(self, name) < MIN_VALIDITY:
                raise InvalidRequest(name, f"must be at least {MIN_VALIDITY}")

    def reserved(self, namespace: str) -> bool:
        """Whether ``namespace`` holds the components' identities (the configured control
        plane namespace, or the one component certificates name): no service certificate
        is issued in it."""
        return namespace in (self.control_plane_namespace, components.CONTROL_PLANE_NAMESPACE)

    def lifetime_fits(self, lifetime: dt.timedelta, validity: dt.timedelta | None) -> bool:
        """Whether a certificate of ``lifetime`` was issued for ``validity`` (within the
        jitter band). Callers that pass the mesh's configured validity on every call (the
        catalog, from MeshConfig) get the current certificate back, not a new one each time.
        """
        if validity is None:
            return True
        slack = dt.timedelta(minutes=2)
        low = validity * (1 - self.jitter) - slack
        high = validity * (1 + self.jitter) + slack
        return low <= lifetime <= high


class Issuer:
    """Signs leaves with one CA. ``rng`` is injectable so jitter can be tested."""

    def __init__(
        self,
        ca: CertificateAuthority,
        algorithm: KeyAlgorithm,
        policy: IssuancePolicy,
        rng: random.Random | None = None,
    ) -> None:
        self.ca = ca
        self.algorithm = algorithm
        self.policy = policy
        self._rng = rng or random.SystemRandom()
        # The same for every leaf this CA signs: computed once.
        self._chain_pem = ca.chain_pem
        self._issuer_text = ca.cert.subject.rfc4514_string()
        self._ca_not_after = ca.cert.not_valid_after_utc
        key_usage = x509.KeyUsage(
            digital_signature=True,
            key_encipherment=True,
            content_commitment=False,
            data_encipherment=False,
            key_agreement=False,
            key_cert_sign=False,
            crl_sign=False,
            encipher_only=False,
            decipher_only=False,
        )
        both = x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        )
        client_only = x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])

        def template(extended_usage: x509.ExtendedKeyUsage) -> LeafTemplate:
            # Every leaf's extensions, in this order, then its subjectAltName (if any).
            fixed: list[tuple[x509.ExtensionType, bool]] = [
                (x509.BasicConstraints(ca=False, path_length=None), True),
                (key_usage, True),
                (extended_usage, False),
                (authority_key_identifier(ca.cert), False),
            ]
            return LeafTemplate(
                ca.cert.subject, ca.key, [x509.Extension(v.oid, c, v) for v, c in fixed]
            )

        self._template = template(both)
        # A proxy certificate only ever authenticates its proxy to proxy-cp: clientAuth
        # only, so no server (a workload, a component) can be stood up with one.
        self._client_template = template(client_only)

    def service_common_name(self, service: MeshService) -> str:
        try:
            return ServiceCommonName.for_service(service, self.policy.trust_domain).format()
        except InvalidIdentifier as exc:
            raise InvalidRequest("service", str(exc)) from exc

    def issue_service(
        self,
        service: MeshService,
        service_account: str,
        now: dt.datetime,
        validity: dt.timedelta | None = None,
    ) -> CertificateRecord:
        if self.policy.reserved(service.namespace):
            raise ControlPlaneNamespace(service.namespace, service.name)
        cn = self.service_common_name(service)
        try:
            spiffe = SpiffeId(self.policy.trust_domain, service.namespace, service_account)
            dns = service_dns_names(service, self.policy.cluster_domain)
        except InvalidIdentifier as exc:
            raise InvalidRequest(exc.field.replace(" ", "_"), str(exc)) from exc
        base = _checked_validity(validity, self.policy.service_validity)
        spread = self._rng.uniform(-self.policy.jitter, self.policy.jitter)
        lifetime = base * (1 + spread)
        return self._sign(
            cn=cn,
            kind=CertificateKind.SERVICE,
            service=service,
            service_account=service_account,
            proxy_id="",
            dns_names=dns,
            uris=(spiffe.uri,),
            lifetime=lifetime,
            now=now,
        )

    def issue_proxy(
        self,
        common_name: ProxyCommonName,
        service_account: str,
        now: dt.datetime,
        validity: dt.timedelta | None = None,
        *,
        public_key: PublicKey,
    ) -> CertificateRecord:
        """A proxy certificate for ``public_key`` (from the proxy's CSR, or the current
        certificate's on rotation): the record has no key, the proxy's host has it."""
        if self.policy.reserved(common_name.namespace):
            raise InvalidRequest(
                "service.namespace",
                f"{common_name.namespace!r} is the control plane's namespace: no proxy "
                "certificate is issued in it",
            )
        lifetime = _checked_validity(validity, self.policy.proxy_validity, MAX_PROXY_VALIDITY)
        return self._sign(
            cn=common_name.format(),
            kind=CertificateKind.PROXY,
            service=MeshService(common_name.namespace, common_name.service),
            service_account=service_account,
            proxy_id=common_name.proxy_id,
            dns_names=(),
            uris=(),
            lifetime=lifetime,
            now=now,
            public_key=public_key,
            client_only=True,
        )

    def issue_workload(
        self,
        service: MeshService,
        service_account: str,
        public_key: PublicKey,
        now: dt.datetime,
        not_after: dt.datetime,
    ) -> x509.Certificate:
        """A proxy's own workload certificate (for its proxy certificate's key), for mesh
        mTLS: the SPIFFE id of ``service_account`` (a pod's own ServiceAccount, a VM's
        onboarded account), and ``service``'s DNS names; it ends with the proxy certificate
        issued with it (``not_after``). Not a record: it is renewed with its proxy
        certificate."""
        try:
            spiffe = SpiffeId(self.policy.trust_domain, service.namespace, service_account)
            dns = service_dns_names(service, self.policy.cluster_domain)
        except InvalidIdentifier as exc:
            raise InvalidRequest(exc.field.replace(" ", "_"), str(exc)) from exc
        return x509.load_der_x509_certificate(
            self._leaf(
                x509.random_serial_number(),
                f"{service_account}.{service.namespace}",
                service.namespace,
                dns,
                (spiffe.uri,),
                public_key,
                now - BACKDATE,
                min(not_after, self._ca_not_after),
            )
        )

    def issue_component(
        self, component: str, public_key: PublicKey, now: dt.datetime, lifetime: dt.timedelta
    ) -> x509.Certificate:
        """A control plane component's certificate (for a CSR's key): its SPIFFE id, and the
        DNS names clients check it by, its own only (proxy-cp's also ``proxy_cp_extra_sans``:
        the names its proxyless clients dial it by, with no name override). The only leaf
        issued in the control plane's namespace. Not a record: components renew their own."""
        try:
            spiffe = components.spiffe_id(self.policy.trust_domain, component)
        except (components.UnknownComponent, InvalidIdentifier) as exc:
            raise InvalidRequest("component", str(exc)) from exc
        names = components.dns_names(component, self.policy.cluster_domain)
        if component == components.PROXY_CP:
            names += tuple(n for n in self.policy.proxy_cp_extra_sans if n not in names)
        not_before = now - BACKDATE
        return x509.load_der_x509_certificate(
            self._leaf(
                x509.random_serial_number(),
                f"{component}.{components.CONTROL_PLANE_NAMESPACE}",
                components.CONTROL_PLANE_NAMESPACE,
                names,
                (spiffe.uri,),
                public_key,
                not_before,
                min(now + lifetime, self._ca_not_after),
            )
        )

    def _leaf(
        self,
        serial: int,
        cn: str,
        unit: str,
        dns_names: tuple[str, ...],
        uris: tuple[str, ...],
        public_key: PublicKey,
        not_before: dt.datetime,
        not_after: dt.datetime,
        client_only: bool = False,
    ) -> bytes:
        """The DER of a leaf for ``public_key``, signed by the CA: subject O=Trellis,
        OU=``unit``, CN=``cn``; the SANs ``dns_names`` (IP addresses among them become
        iPAddress names) and ``uris``; extendedKeyUsage clientAuth only if ``client_only``,
        else serverAuth and clientAuth."""
        template = self._client_template if client_only else self._template
        tbs = template.tbs(
            serial=serial,
            not_before=not_before,
            not_after=not_after,
            unit=unit,
            common_name=cn,
            public_key=public_key,
            dns_names=dns_names,
            uris=uris,
        )
        return template.sign(tbs)

    def chain_pem(self, cert: x509.Certificate) -> bytes:
        return cert.public_bytes(serialization.Encoding.PEM) + self._chain_pem

    def reissue(
        self, current: CertificateRecord, now: dt.datetime, key: PublicKey | None = None
    ) -> CertificateRecord:
        """``current`` issued again: a service's with a new key; a proxy's for the same key
        (an operator's rotation), or for ``key`` (a renewal brings the proxy's new one)."""
        service = MeshService(current.namespace, current.service)
        if current.kind == CertificateKind.SERVICE:
            return self.issue_service(service, current.service_account, now)
        cn = ProxyCommonName(ProxyId(current.proxy_id), current.service, current.namespace)
        key = key if key is not None else leaf_public_key(current.cert_chain_pem)
        return self.issue_proxy(cn, current.service_account, now, public_key=key)

    def workload_chain(self, proxy: CertificateRecord, now: dt.datetime) -> bytes:
        """``proxy``'s own workload certificate (PEM chain) for its key, ending with it:
        signed afresh on each call, never recorded; renewed with the proxy certificate."""
        if proxy.kind != CertificateKind.PROXY:
            raise InvalidRequest("kind", f"{proxy.common_name} is not a proxy certificate")
        workload = self.issue_workload(
            MeshService(proxy.namespace, proxy.service),
            proxy.service_account,
            leaf_public_key(proxy.cert_chain_pem),
            now,
            proxy.not_after,
        )
        return self.chain_pem(workload)

    def _sign(
        self,
        *,
        cn: str,
        kind: CertificateKind,
        service: MeshService,
        service_account: str,
        proxy_id: str,
        dns_names: tuple[str, ...],
        uris: tuple[str, ...],
        lifetime: dt.timedelta,
        now: dt.datetime,
        public_key: PublicKey | None = None,
        client_only: bool = False,
    ) -> CertificateRecord:
        """Sign a leaf: for ``public_key`` (from a CSR: the record then has no key), else
        for a key made here (service certificates, whose key proxy-cp serves over SDS)."""
        not_before = now - BACKDATE
        # A leaf never outlives its CA: clamp rather than hand out a chain that breaks.
        not_after = min(now + lifetime, self._ca_not_after)
        key = generate_key(self.algorithm) if public_key is None else None
        subject_key = key.public_key() if key is not None else public_key
        assert subject_key is not None
        serial = x509.random_serial_number()
        cert_der = self._leaf(
            serial,
            cn,
            service.namespace,
            dns_names,
            uris,
            subject_key,
            not_before,
            not_after,
            client_only,
        )
        renew_after = not_before + (not_after - not_before) * self.policy.renew_fraction
        return CertificateRecord(
            common_name=cn,
            kind=kind,
            serial=serial,
            not_before=not_before,
            not_after=not_after,
            renew_after=renew_after,
            namespace=service.namespace,
            service=service.name,
            service_account=service_account,
            proxy_id=proxy_id,
            dns_names=dns_names,
            uris=uris,
            issuer=self._issuer_text,
            fingerprint=fingerprint_der(cert_der),
            cert_chain_pem=der.pem(cert_der) + self._chain_pem,
            key_pem=b"" if key is None else key_to_pem(key),
        )


#: The longest lifetime a caller may ask for: a service certificate's, and a proxy's (a
#: proxy renews its own certificate; a stolen one must not stay good for years).
MAX_VALIDITY = dt.timedelta(days=3650)
MAX_PROXY_VALIDITY = dt.timedelta(days=7)


def _checked_validity(
    requested: dt.timedelta | None, default: dt.timedelta, most: dt.timedelta = MAX_VALIDITY
) -> dt.timedelta:
    if requested is None or requested == dt.timedelta(0):
        return default
    if requested < MIN_VALIDITY:
        raise InvalidRequest("validity", f"must be at least {MIN_VALIDITY}, got {requested}")
    if requested > most:
        raise InvalidRequest("validity", f"must be at most {most.days} days, got {requested}")
    return requested
