"""Service and proxy certificates, verified with cryptography as a peer would."""

from __future__ import annotations

import datetime as dt
import random
import statistics

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.errors import ControlPlaneNamespace, InvalidRequest
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer
from trellis_certmanager.domain.keys import KeyAlgorithm, key_from_pem
from trellis_certmanager.domain.records import CertificateKind
from trellis_certmanager.testing import proxy_key
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
BOOKSTORE = MeshService("bookstore", "bookstore-v1")


def leaf(chain_pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificates(chain_pem)[0]


def test_service_certificate_chains_to_root_with_cn_and_sans(
    issuer: Issuer, root_ca: CertificateAuthority
) -> None:
    record = issuer.issue_service(BOOKSTORE, "bookstore", NOW)
    cert = leaf(record.cert_chain_pem)
    cert.verify_directly_issued_by(root_ca.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == (
        "bookstore-v1.bookstore.svc.cluster.local"
    )
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "bookstore-v1",
        "bookstore-v1.bookstore",
        "bookstore-v1.bookstore.svc",
        "bookstore-v1.bookstore.svc.cluster.local",
    ]
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://cluster.local/ns/bookstore/sa/bookstore"
    ]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert record.kind is CertificateKind.SERVICE
    assert record.serial == cert.serial_number
    # the key in the record is the key of the certificate
    assert key_from_pem(record.key_pem).public_key() == cert.public_key()


def test_service_lifetimes_are_jittered_around_the_validity(root_ca: CertificateAuthority) -> None:
    policy = IssuancePolicy(service_validity=dt.timedelta(hours=48), jitter=0.1)
    issuer = Issuer(root_ca, KeyAlgorithm.ECDSA_P256, policy, random.Random(42))
    hours = [
        issuer.issue_service(MeshService("ns", f"svc{i}"), "sa", NOW).lifetime.total_seconds()
        / 3600
        for i in range(60)
    ]
    # the backdating minute is part of the lifetime
    assert all(43.2 <= h - 1 / 60 <= 52.8 for h in hours), hours
    assert max(hours) - min(hours) > 5  # spread, not one renewal moment for the fleet
    assert 46 < statistics.mean(hours) < 50
    assert len({round(h, 3) for h in hours}) == len(hours)


def test_renewal_point_is_the_configured_fraction(root_ca: CertificateAuthority) -> None:
    policy = IssuancePolicy(jitter=0.0, renew_fraction=0.5)
    record = Issuer(root_ca, KeyAlgorithm.ECDSA_P256, policy).issue_service(BOOKSTORE, "sa", NOW)
    assert record.renew_after - record.not_before == record.lifetime / 2
    assert not record.due(NOW)
    assert record.due(record.renew_after)


def test_proxy_certificate_lives_24_hours_with_the_proxy_cn(
    issuer: Issuer, root_ca: CertificateAuthority
) -> None:
    cn = ProxyCommonName.new("bookbuyer", "bookbuyer")
    record = issuer.issue_proxy(cn, "bookbuyer", NOW, public_key=proxy_key())
    cert = leaf(record.cert_chain_pem)
    cert.verify_directly_issued_by(root_ca.cert)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == str(cn)
    assert dt.timedelta(hours=24) <= record.lifetime <= dt.timedelta(hours=24, minutes=2)
    assert record.proxy_id == cn.proxy_id
    assert record.kind is CertificateKind.PROXY


def test_a_proxy_certificate_may_not_be_asked_for_more_than_7_days(issuer: Issuer) -> None:
    cn = ProxyCommonName.new("bookbuyer", "bookbuyer")
    week = issuer.issue_proxy(cn, "bookbuyer", NOW, dt.timedelta(days=7), public_key=proxy_key())
    assert week.lifetime <= dt.timedelta(days=7, minutes=2)
    with pytest.raises(InvalidRequest, match="validity: must be at most 7 days"):
        issuer.issue_proxy(cn, "bookbuyer", NOW, dt.timedelta(days=3650), public_key=proxy_key())


def test_leaf_never_outlives_its_ca(root_ca: CertificateAuthority) -> None:
    issuer = Issuer(root_ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy())
    later = root_ca.cert.not_valid_after_utc - dt.timedelta(days=1)
    record = issuer.issue_proxy(ProxyCommonName.new("a", "b"), "a", later, public_key=proxy_key())
    assert record.not_after == root_ca.cert.not_valid_after_utc


def test_rsa_leaves(root_ca: CertificateAuthority) -> None:
    issuer = Issuer(root_ca, KeyAlgorithm.RSA_2048, IssuancePolicy())
    cert = leaf(issuer.issue_service(BOOKSTORE, "sa", NOW).cert_chain_pem)
    assert isinstance(cert.public_key(), rsa.RSAPublicKey)


@pytest.mark.parametrize(
    ("service", "account", "validity", "field"),
    [
        (MeshService("bookstore", "x" * 60), "sa", None, "service"),
        (BOOKSTORE, "Bad_Account", None, "service_account"),
        (BOOKSTORE, "sa", dt.timedelta(seconds=5), "validity"),
        (BOOKSTORE, "sa", dt.timedelta(days=4000), "validity"),
    ],
)
def test_bad_requests_name_the_field(
    issuer: Issuer,
    service: MeshService,
    account: str,
    validity: dt.timedelta | None,
    field: str,
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        issuer.issue_service(service, account, NOW, validity)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"jitter": 0.7}, "jitter"),
        ({"renew_fraction": 1.0}, "renew_fraction"),
        ({"service_validity": dt.timedelta(seconds=1)}, "service_validity"),
    ],
)
def test_bad_policy_names_the_setting(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest, match=field):
        IssuancePolicy(**kwargs)  # type: ignore[arg-type]


def test_no_proxy_certificate_is_issued_in_the_control_plane_s_namespace(
    issuer: Issuer,
) -> None:
    # a proxy there could pose as proxy-cp (trellis-system/proxy-cp) and be sent its key
    with pytest.raises(InvalidRequest, match="control plane's namespace") as refused:
        issuer.issue_proxy(
            ProxyCommonName.new("proxy-cp", "trellis-system"),
            "proxy-cp",
            NOW,
            public_key=proxy_key(),
        )
    assert refused.value.field == "service.namespace"
    custom = Issuer(issuer.ca, issuer.algorithm, IssuancePolicy(control_plane_namespace="mesh"))
    with pytest.raises(InvalidRequest, match="'mesh' is the control plane's namespace"):
        custom.issue_proxy(ProxyCommonName.new("api", "mesh"), "api", NOW, public_key=proxy_key())
    # the namespace the component certificates name stays reserved too: a workload
    # certificate there would carry a component's SPIFFE id
    with pytest.raises(InvalidRequest, match="'trellis-system' is the control plane's"):
        custom.issue_proxy(
            ProxyCommonName.new("api", "trellis-system"), "api", NOW, public_key=proxy_key()
        )


@pytest.mark.parametrize("namespace", ["trellis-system", "mesh"])
@pytest.mark.parametrize("name", ["proxy-cp", "certmanager", "redis"])
def test_no_service_certificate_is_issued_in_the_control_plane_s_namespace(
    issuer: Issuer, namespace: str, name: str
) -> None:
    """Its names (proxy-cp.trellis-system.svc) and SPIFFE ids are the components': only
    their own certificates carry them. The configured namespace and the one component
    certificates name are both refused."""
    custom = Issuer(issuer.ca, issuer.algorithm, IssuancePolicy(control_plane_namespace="mesh"))
    with pytest.raises(ControlPlaneNamespace, match="the control plane's namespace") as refused:
        custom.issue_service(MeshService(namespace, name), name, NOW)
    assert refused.value.reason == "control_plane_namespace"
    assert custom.issue_service(MeshService("shop", name), name, NOW)


def test_leaves_name_their_issuer_by_the_cas_own_key_identifier() -> None:
    """An operator's CA whose subjectKeyIdentifier is not the SHA-1 of its key (Go 1.25
    writes truncated SHA-256: Helm's genCA, cert-manager): leaves carry that identifier as
    their authorityKeyIdentifier, or verifiers cannot find their issuer."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "operator root")])
    skid = x509.SubjectKeyIdentifier(bytes(range(20)))  # not the key's SHA-1
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(NOW - dt.timedelta(days=1)).not_valid_after(NOW + dt.timedelta(days=900))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(skid, critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    ca = CertificateAuthority(cert, key, (), (cert,), "provided")
    issued = leaf(Issuer(ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy()).issue_service(
        BOOKSTORE, "sa", NOW
    ).cert_chain_pem)  # fmt: skip
    aki = issued.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    assert aki.key_identifier == skid.digest
    assert x509.SubjectKeyIdentifier.from_public_key(key.public_key()).digest != skid.digest


def test_the_proxy_lifetime_setting_is_capped_at_7_days() -> None:
    from pydantic import ValidationError

    from trellis_certmanager.settings import CertManagerSettings

    assert CertManagerSettings.model_validate({}).proxy_cert_validity == dt.timedelta(hours=24)
    with pytest.raises(ValidationError, match="proxy_cert_validity"):
        CertManagerSettings.model_validate({"proxy_cert_validity": dt.timedelta(days=8)})
