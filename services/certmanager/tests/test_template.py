"""The leaf template against ``x509.CertificateBuilder``, the way leaves were built before.

For the same inputs (serial, validity, names, keys) the template's TBSCertificate must be
the builder's byte for byte, under an ECDSA P-256 root, an RSA root and an operator's
P-384 CA with a long, mixed subject; with RSA CAs (PKCS #1 v1.5 signatures are
deterministic) the whole certificate must be. What the builder refuses, the template
refuses too.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from trellis_certmanager.domain import records
from trellis_certmanager.domain.authority import CertificateAuthority, fingerprint, generate_root
from trellis_certmanager.domain.csr import PublicKey, signed_for
from trellis_certmanager.domain.errors import CAError
from trellis_certmanager.domain.issuer import IssuancePolicy, Issuer, authority_key_identifier
from trellis_certmanager.domain.keys import KeyAlgorithm, key_from_pem
from trellis_certmanager.domain.template import LeafTemplate
from trellis_common import components
from trellis_common.ids import ProxyCommonName
from trellis_common.model import MeshService

NOW = dt.datetime(2026, 11, 22, 12, 0, tzinfo=dt.UTC)
UTC = dt.UTC


def leaf_extensions(
    ca: CertificateAuthority, client_only: bool = False
) -> list[x509.Extension[x509.ExtensionType]]:
    """The extensions every leaf carries, as the issuer adds them: a proxy certificate's
    extendedKeyUsage is clientAuth only, every other leaf's serverAuth and clientAuth."""
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
    usages = x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.CLIENT_AUTH]
        if client_only
        else [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    )
    values: list[tuple[x509.ExtensionType, bool]] = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (key_usage, True),
        (usages, False),
        (authority_key_identifier(ca.cert), False),
    ]
    return [x509.Extension(value.oid, critical, value) for value, critical in values]


@dataclass(frozen=True)
class Leaf:
    """The inputs of one leaf."""

    serial: int = 0x1234
    not_before: dt.datetime = NOW - dt.timedelta(minutes=1)
    not_after: dt.datetime = NOW + dt.timedelta(hours=24)
    unit: str = "bookstore"
    common_name: str = "bookstore-v1.bookstore.svc.cluster.local"
    public_key: PublicKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1()).public_key()
    )
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    client_only: bool = False


def builder_certificate(ca: CertificateAuthority, leaf: Leaf) -> x509.Certificate:
    """The oracle: the leaf as the issuer built it with cryptography's builder."""
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Trellis"),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, leaf.unit),
                    x509.NameAttribute(NameOID.COMMON_NAME, leaf.common_name),
                ]
            )
        )
        .issuer_name(ca.cert.subject)
        .public_key(leaf.public_key)
        .serial_number(leaf.serial)
        .not_valid_before(leaf.not_before)
        .not_valid_after(leaf.not_after)
    )
    for ext in leaf_extensions(ca, leaf.client_only):
        builder = builder.add_extension(ext.value, critical=ext.critical)
    sans: list[x509.GeneralName] = []
    for name in leaf.dns_names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            sans.append(x509.DNSName(name))
    sans += [x509.UniformResourceIdentifier(u) for u in leaf.uris]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca.key, hashes.SHA256())


def template_tbs(template: LeafTemplate, leaf: Leaf) -> bytes:
    return template.tbs(
        serial=leaf.serial,
        not_before=leaf.not_before,
        not_after=leaf.not_after,
        unit=leaf.unit,
        common_name=leaf.common_name,
        public_key=leaf.public_key,
        dns_names=leaf.dns_names,
        uris=leaf.uris,
    )


def operator_ca() -> CertificateAuthority:
    """An operator's P-384 CA with a long subject of mixed string types (a PrintableString
    country, a multi-valued RDN) and no subjectKeyIdentifier."""
    key = ec.generate_private_key(ec.SECP384R1())
    name = x509.Name(
        [
            x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COUNTRY_NAME, "NL")]),
            x509.RelativeDistinguishedName(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Operator B.V."),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "Platform"),
                ]
            ),
            x509.RelativeDistinguishedName(
                [x509.NameAttribute(NameOID.COMMON_NAME, "Operator issuing CA Ω " + "x" * 40)]
            ),
        ]
    )
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(7)
        .not_valid_before(NOW - dt.timedelta(days=1)).not_valid_after(NOW + dt.timedelta(days=900))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    assert len(name.public_bytes()) > 127
    return CertificateAuthority(cert, key, (), (cert,), "provided")


CAS = {
    "ecdsa-root": lambda: generate_root(
        KeyAlgorithm.ECDSA_P256, dt.timedelta(days=3650), NOW, "cluster.local"
    ),
    "rsa-root": lambda: generate_root(
        KeyAlgorithm.RSA_2048, dt.timedelta(days=3650), NOW, "cluster.local"
    ),
    "operator-p384": operator_ca,
}


@pytest.fixture(scope="module", params=sorted(CAS))
def ca(request: pytest.FixtureRequest) -> CertificateAuthority:
    return CAS[request.param]()


RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048).public_key()
P384_KEY = ec.generate_private_key(ec.SECP384R1()).public_key()
LONG_LABEL = "n" * 63
MINUS_7 = dt.timezone(-dt.timedelta(hours=7))
CASES = {
    "short-names-no-sans": Leaf(serial=1, unit="b", common_name="a"),
    "proxy": Leaf(unit="bookbuyer", common_name="5f0c2d9e-3a61-4b43-9c36-0f4de5e1b8a1.bb.bb"),
    "service-dns-and-spiffe": Leaf(
        dns_names=(
            "bookstore-v1",
            "bookstore-v1.bookstore",
            "bookstore-v1.bookstore.svc",
            "bookstore-v1.bookstore.svc.cluster.local",
        ),
        uris=("spiffe://cluster.local/ns/bookstore/sa/bookstore",),
    ),
    "spiffe-only": Leaf(uris=("spiffe://cluster.local/ns/a/sa/b",)),
    "ip-addresses": Leaf(dns_names=("localhost", "127.0.0.1", "::1", "fd00::10")),
    "long-names": Leaf(  # multi-octet lengths in the subject, each SAN and the extension
        unit=LONG_LABEL,
        common_name="c" * 64,
        dns_names=(f"{LONG_LABEL}.{LONG_LABEL}.{LONG_LABEL}.{LONG_LABEL[:61]}", "short"),
        uris=(f"spiffe://{LONG_LABEL}.example/ns/{LONG_LABEL}/sa/{'s' * 200}",),
    ),
    "empty-unit": Leaf(unit=""),
    "mixed-naive-and-aware": Leaf(not_before=dt.datetime(2026, 11, 22, 11, 59)),
    "utf8-common-name": Leaf(unit="bücher", common_name="bücher-v1.bücher.svc.example"),
    "serial-high-bit": Leaf(serial=(1 << 151) | 0xABCDEF),
    "serial-widest": Leaf(serial=(1 << 159) - 1),
    "serial-0x80": Leaf(serial=0x80),
    "across-2050": Leaf(
        not_before=dt.datetime(2049, 12, 31, 23, 59, 30, tzinfo=UTC),
        not_after=dt.datetime(2050, 1, 1, 0, 0, 30, tzinfo=UTC),
    ),
    "after-2050": Leaf(
        not_before=dt.datetime(2061, 3, 4, 5, 6, 7, tzinfo=UTC),
        not_after=dt.datetime(2071, 3, 4, 5, 6, 7, tzinfo=UTC),
    ),
    "from-1950": Leaf(not_before=dt.datetime(1950, 1, 1, tzinfo=UTC)),
    "offset-and-microseconds": Leaf(
        not_before=dt.datetime(2026, 1, 1, 3, 4, 5, 678901, tzinfo=MINUS_7),
        not_after=dt.datetime(2049, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ),
    "naive-utc": Leaf(
        not_before=dt.datetime(2026, 1, 1), not_after=dt.datetime(2026, 1, 2, 0, 0, 1)
    ),
    "empty-validity": Leaf(not_before=NOW, not_after=NOW),
    "rsa-subject-key": Leaf(public_key=RSA_KEY, uris=("spiffe://cluster.local/ns/a/sa/b",)),
    "p384-subject-key": Leaf(public_key=P384_KEY),
}


@pytest.mark.parametrize("leaf", list(CASES.values()), ids=list(CASES))
def test_the_template_encodes_what_the_builder_did(ca: CertificateAuthority, leaf: Leaf) -> None:
    template = LeafTemplate(ca.cert.subject, ca.key, leaf_extensions(ca))
    expected = builder_certificate(ca, leaf)
    tbs = template_tbs(template, leaf)
    assert tbs == expected.tbs_certificate_bytes
    issued_der = template.sign(tbs)
    issued = x509.load_der_x509_certificate(issued_der)
    issued.verify_directly_issued_by(ca.cert)
    assert issued.tbs_certificate_bytes == tbs
    assert issued.signature_algorithm_oid == expected.signature_algorithm_oid
    assert issued.serial_number == leaf.serial
    if isinstance(ca.key, rsa.RSAPrivateKey):  # deterministic signature: the same bytes
        assert issued_der == expected.public_bytes(serialization.Encoding.DER)


REFUSED = {
    "serial-zero": Leaf(serial=0),
    "serial-160-bits": Leaf(serial=1 << 159),
    "common-name-empty": Leaf(common_name=""),
    "common-name-65-octets": Leaf(common_name="c" * 65),
    "common-name-33-two-octet-characters": Leaf(common_name="ü" * 33),
    "validity-ends-before-it-starts": Leaf(not_after=NOW - dt.timedelta(hours=1)),
    "before-1950": Leaf(not_before=dt.datetime(1949, 12, 31, 23, 59, 59, tzinfo=UTC)),
    "lone-surrogate-in-unit": Leaf(unit="\ud800"),
    "non-ascii-dns-name": Leaf(dns_names=("bücher.example",)),
    "non-ascii-uri": Leaf(uris=("spiffe://bücher/ns/a/sa/b",)),
}


@pytest.mark.parametrize("leaf", list(REFUSED.values()), ids=list(REFUSED))
def test_what_the_builder_refused_is_refused(leaf: Leaf) -> None:
    ca = CAS["ecdsa-root"]()
    with pytest.raises(ValueError):  # noqa: PT011  (the builder's messages are its own)
        builder_certificate(ca, leaf)
    template = LeafTemplate(ca.cert.subject, ca.key, leaf_extensions(ca))
    with pytest.raises(ValueError):  # noqa: PT011
        template_tbs(template, leaf)


def test_a_ca_key_that_is_not_ecdsa_or_rsa_is_refused_without_showing_it() -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    ca = CAS["ecdsa-root"]()
    with pytest.raises(CAError, match="Ed25519PrivateKey cannot sign leaves") as refused:
        LeafTemplate(ca.cert.subject, key, leaf_extensions(ca))
    raw = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    assert raw.hex() not in str(refused.value)
    assert "PRIVATE KEY" not in str(refused.value)


def test_the_subject_alt_name_is_never_a_fixed_extension() -> None:
    ca = CAS["ecdsa-root"]()
    san = x509.SubjectAlternativeName([x509.DNSName("a")])
    extensions: Sequence[x509.Extension[x509.ExtensionType]] = [
        *leaf_extensions(ca),
        x509.Extension(san.oid, False, san),
    ]
    with pytest.raises(ValueError, match="varies per leaf"):
        LeafTemplate(ca.cert.subject, ca.key, extensions)


def test_leaves_differ_only_where_their_inputs_do() -> None:
    """Two leaves of one template share every byte outside the fields filled in."""
    ca = CAS["rsa-root"]()
    template = LeafTemplate(ca.cert.subject, ca.key, leaf_extensions(ca))
    first = Leaf()
    second = replace(first, serial=0x5678)
    one, other = template_tbs(template, first), template_tbs(template, second)
    assert len(one) == len(other)
    assert [i for i, (a, b) in enumerate(zip(one, other, strict=True)) if a != b] == [
        one.index(b"\x02\x02\x12\x34") + 2,
        one.index(b"\x02\x02\x12\x34") + 3,
    ]


# The issuer's leaves, each against the builder given the same inputs; the random ones
# (serial, jittered lifetime, a service's key) are read back from what was issued.

BOOKSTORE = MeshService("bookstore", "bookstore-v1")
BOOKSTORE_DNS = (
    "bookstore-v1",
    "bookstore-v1.bookstore",
    "bookstore-v1.bookstore.svc",
    "bookstore-v1.bookstore.svc.cluster.local",
)
NOT_BEFORE = NOW - dt.timedelta(minutes=1)


def first(chain_pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificates(chain_pem)[0]


def verified_as_server(ca: CertificateAuthority, cert: x509.Certificate, name: str) -> None:
    """The chain as a TLS client checks it (RFC 5280 path validation, cryptography's
    policy); the generated roots only: the operator CA of these tests has no keyUsage."""
    if ca.origin != "generated":
        return
    verifier = (
        PolicyBuilder()
        .store(Store(list(ca.roots)))
        .time(NOW)
        .build_server_verifier(x509.DNSName(name))
    )
    assert verifier.verify(cert, list(ca.intermediates))[-1] == ca.roots[0]


@pytest.mark.parametrize("algorithm", list(KeyAlgorithm))
def test_service_certificates_are_the_builders(
    ca: CertificateAuthority, algorithm: KeyAlgorithm
) -> None:
    record = Issuer(ca, algorithm, IssuancePolicy()).issue_service(BOOKSTORE, "bookstore", NOW)
    cert = first(record.cert_chain_pem)
    expected = Leaf(
        serial=record.serial,
        not_before=NOT_BEFORE,
        not_after=record.not_after,
        common_name="bookstore-v1.bookstore.svc.cluster.local",
        public_key=key_from_pem(record.key_pem).public_key(),  # type: ignore[arg-type]
        dns_names=BOOKSTORE_DNS,
        uris=("spiffe://cluster.local/ns/bookstore/sa/bookstore",),
    )
    assert cert.tbs_certificate_bytes == builder_certificate(ca, expected).tbs_certificate_bytes
    assert ca.signed(record.cert_chain_pem)
    assert records.check(record) is record
    assert record.fingerprint == fingerprint(cert)
    assert record.cert_chain_pem == cert.public_bytes(serialization.Encoding.PEM) + ca.chain_pem
    verified_as_server(ca, cert, "bookstore-v1.bookstore.svc.cluster.local")


@pytest.mark.parametrize("key", [ec.SECP256R1(), ec.SECP384R1(), None], ids=["p256", "p384", "rsa"])
def test_proxy_certificates_are_the_builders(
    ca: CertificateAuthority, key: ec.EllipticCurve | None
) -> None:
    public_key: PublicKey = RSA_KEY if key is None else ec.generate_private_key(key).public_key()
    cn = ProxyCommonName.new("bookbuyer", "bookbuyer")
    record = Issuer(ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy()).issue_proxy(
        cn, "bookbuyer", NOW, public_key=public_key
    )
    cert = first(record.cert_chain_pem)
    expected = Leaf(
        serial=record.serial,
        not_before=NOT_BEFORE,
        not_after=min(NOW + dt.timedelta(hours=24), ca.cert.not_valid_after_utc),
        unit="bookbuyer",
        common_name=str(cn),
        public_key=public_key,
        client_only=True,
    )
    assert cert.tbs_certificate_bytes == builder_certificate(ca, expected).tbs_certificate_bytes
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]  # no server may serve one
    assert ca.signed(record.cert_chain_pem)
    assert records.check(record) is record
    assert signed_for(record.cert_chain_pem, public_key)


def test_component_certificates_are_the_builders(ca: CertificateAuthority) -> None:
    public_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    issuer = Issuer(ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy())
    cert = issuer.issue_component(components.PROXY_CP, public_key, NOW, dt.timedelta(days=30))
    expected = Leaf(
        serial=cert.serial_number,
        not_before=NOT_BEFORE,
        not_after=min(NOW + dt.timedelta(days=30), ca.cert.not_valid_after_utc),
        unit="trellis-system",
        common_name="proxy-cp.trellis-system",
        public_key=public_key,
        dns_names=(
            *components.dns_names(components.PROXY_CP, "cluster.local"),
            "localhost",
            "127.0.0.1",
            "::1",
        ),
        uris=("spiffe://cluster.local/ns/trellis-system/sa/proxy-cp",),
    )
    assert cert.tbs_certificate_bytes == builder_certificate(ca, expected).tbs_certificate_bytes
    assert ca.signed(issuer.chain_pem(cert))
    # what proxy-cp serves xDS with: its proxyless clients dial a loopback address as
    # localhost, with no name override
    verified_as_server(ca, cert, "localhost")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]


def test_another_component_s_certificate_names_only_itself(ca: CertificateAuthority) -> None:
    public_key = ec.generate_private_key(ec.SECP256R1()).public_key()
    issuer = Issuer(ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy())
    cert = issuer.issue_component(components.CATALOG, public_key, NOW, dt.timedelta(days=1))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "catalog",
        "catalog.trellis-system",
        "catalog.trellis-system.svc",
        "catalog.trellis-system.svc.cluster.local",
    ]
    assert sans.get_values_for_type(x509.IPAddress) == []


def test_a_ca_past_its_end_issues_nothing(ca: CertificateAuthority) -> None:
    """A leaf is clamped to its CA's end: a CA already past it gets a ValueError, as the
    builder raised, never a leaf whose validity ends before it starts."""
    later = ca.cert.not_valid_after_utc + dt.timedelta(minutes=5)
    issuer = Issuer(ca, KeyAlgorithm.ECDSA_P256, IssuancePolicy())
    with pytest.raises(ValueError, match="ends before it starts"):
        issuer.issue_proxy(ProxyCommonName.new("a", "b"), "a", later, public_key=P384_KEY)
