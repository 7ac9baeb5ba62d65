"""The gRPC API over a real grpc.aio server and client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial

import grpc
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from google.protobuf import duration_pb2
from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_certmanager.transport.grpc_api import SERVICE_NAME, CertificateManagerServicer
from trellis_identity.identity import csr_for, new_key
from trellis_runtime.health import Health
from trellis_testing.servicer import served

SERVICE = pb.MeshService(namespace="bookstore", name="bookstore")
PROXY_CN = "123e4567-e89b-42d3-a456-426614174000.bookstore.bookstore"
KEY = new_key()[1]
CSR = csr_for(KEY, "the proxy's own")


@pytest.fixture
def metrics() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def health(metrics: CollectorRegistry) -> Health:
    return Health(metrics)


@pytest.fixture
async def stub(
    manager: CertificateManager, health: Health
) -> AsyncIterator[pb_grpc.CertificateManagerAsyncStub]:
    servicer = CertificateManagerServicer(manager, health.rejections)
    register = partial(pb_grpc.add_CertificateManagerServicer_to_server, servicer)
    async with served(register, SERVICE_NAME) as channel:
        yield pb_grpc.CertificateManagerStub(channel)


async def test_issue_get_and_root(stub: pb_grpc.CertificateManagerAsyncStub) -> None:
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, service_account="bookstore"
        )
    )
    root = await stub.GetRoot(pb.GetRootRequest())
    leaf = x509.load_pem_x509_certificates(issued.cert_chain_pem)[0]
    leaf.verify_directly_issued_by(x509.load_pem_x509_certificate(root.trust_bundle_pem))
    assert issued.trust_bundle_pem == root.trust_bundle_pem
    assert b"PRIVATE KEY" in issued.private_key_pem
    assert issued.info.uris == ["spiffe://cluster.local/ns/bookstore/sa/bookstore"]
    assert root.origin == "generated"
    got = await stub.GetCertificate(pb.GetCertificateRequest(common_name=issued.info.common_name))
    assert got.info.serial == issued.info.serial


async def test_metadata_only_callers_get_no_key(stub: pb_grpc.CertificateManagerAsyncStub) -> None:
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, omit_private_key=True
        )
    )
    assert issued.private_key_pem == b""
    assert b"BEGIN CERTIFICATE" in issued.cert_chain_pem


async def test_custom_validity_and_proxy_kind(stub: pb_grpc.CertificateManagerAsyncStub) -> None:
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_PROXY,
            service=SERVICE,
            validity=duration_pb2.Duration(seconds=3600),
            csr_pem=CSR,
        )
    )
    lifetime = issued.info.not_after.ToDatetime() - issued.info.not_before.ToDatetime()
    assert 3600 <= lifetime.total_seconds() <= 3660
    assert issued.info.kind == pb.CERTIFICATE_KIND_PROXY
    assert issued.info.proxy_id
    assert issued.info.common_name.startswith(issued.info.proxy_id)


async def test_a_proxy_certificate_is_for_the_csr_s_key_and_the_answer_has_no_key(
    stub: pb_grpc.CertificateManagerAsyncStub, store: InMemoryCertificateStore
) -> None:
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, csr_pem=CSR)
    )
    assert issued.private_key_pem == b""
    leaf = x509.load_pem_x509_certificate(issued.cert_chain_pem)
    assert leaf.public_key() == KEY.public_key()
    assert store.records[issued.info.common_name].key_pem == b""  # never had it
    got = await stub.GetCertificate(pb.GetCertificateRequest(common_name=issued.info.common_name))
    assert got.private_key_pem == b""
    rotated = await stub.RotateCertificate(
        pb.RotateCertificateRequest(common_name=issued.info.common_name)
    )
    assert rotated.info.serial != issued.info.serial
    assert x509.load_pem_x509_certificate(rotated.cert_chain_pem).public_key() == KEY.public_key()


async def test_a_proxy_certificate_comes_with_the_proxy_s_own_workload_certificate(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    """No proxy is sent a key shared by its service: each gets a workload certificate for
    its own key, naming its account; the proxy certificate itself may only be a client."""
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_PROXY,
            service=SERVICE,
            service_account="bookstore-sa",
            csr_pem=CSR,
        )
    )
    proxy = x509.load_pem_x509_certificate(issued.cert_chain_pem)
    workload = x509.load_pem_x509_certificate(issued.workload_cert_chain_pem)
    assert workload.public_key() == KEY.public_key() == proxy.public_key()
    sans = workload.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://cluster.local/ns/bookstore/sa/bookstore-sa"
    ]
    assert "bookstore.bookstore.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    assert workload.not_valid_after_utc == proxy.not_valid_after_utc
    eku = x509.ExtendedKeyUsage
    assert list(workload.extensions.get_extension_for_class(eku).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH,
        ExtendedKeyUsageOID.CLIENT_AUTH,
    ]
    assert list(proxy.extensions.get_extension_for_class(eku).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH
    ]
    assert issued.private_key_pem == b""
    service = await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE)
    )
    assert service.workload_cert_chain_pem == b""  # only proxies have one


async def test_a_proxy_certificate_without_a_csr_is_refused_naming_csr_pem(
    stub: pb_grpc.CertificateManagerAsyncStub, store: InMemoryCertificateStore, health: Health
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.IssueCertificate(
            pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("csr_pem: is required")
    assert store.records == {}
    assert any("csr_pem" in r.reason for r in health.rejections.items())


async def test_list_carries_no_keys_and_filters(stub: pb_grpc.CertificateManagerAsyncStub) -> None:
    await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE)
    )
    await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, csr_pem=CSR)
    )
    listed = await stub.ListCertificates(pb.ListCertificatesRequest())
    assert len(listed.certificates) == 2
    assert b"PRIVATE KEY" not in listed.SerializeToString()
    proxies = await stub.ListCertificates(
        pb.ListCertificatesRequest(kind=pb.CERTIFICATE_KIND_PROXY)
    )
    assert [c.kind for c in proxies.certificates] == [pb.CERTIFICATE_KIND_PROXY]
    assert listed.revision == 2


@pytest.mark.parametrize(
    ("request_", "code", "field"),
    [
        (
            pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_SERVICE),
            "INVALID_ARGUMENT",
            "service",
        ),
        (pb.IssueCertificateRequest(service=SERVICE), "INVALID_ARGUMENT", "kind"),
        (
            pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_SERVICE,
                service=pb.MeshService(namespace="Bad_NS", name="x"),
            ),
            "INVALID_ARGUMENT",
            "namespace",
        ),
        (
            pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, proxy_id="123", csr_pem=CSR
            ),
            "INVALID_ARGUMENT",
            "proxy",
        ),
        (
            pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_SERVICE,
                service=SERVICE,
                validity=duration_pb2.Duration(seconds=1),
            ),
            "INVALID_ARGUMENT",
            "validity",
        ),
    ],
)
async def test_bad_requests_name_the_field(
    stub: pb_grpc.CertificateManagerAsyncStub,
    request_: pb.IssueCertificateRequest,
    code: str,
    field: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.IssueCertificate(request_)
    assert caught.value.code().name == code
    assert field in (caught.value.details() or "")


@pytest.mark.parametrize(
    "common_name",
    ["nope.bookstore.svc.cluster.local", "123e4567-e89b-42d3-a456-426614174000.nope.bookstore"],
)
async def test_unknown_certificate_is_not_found(
    stub: pb_grpc.CertificateManagerAsyncStub, common_name: str
) -> None:
    for call in (
        stub.GetCertificate(pb.GetCertificateRequest(common_name=common_name)),
        stub.RotateCertificate(pb.RotateCertificateRequest(common_name=common_name)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert common_name in (caught.value.details() or "")


async def test_certificate_info_is_the_metadata_without_the_key(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE)
    )
    proxy = await stub.IssueCertificate(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_PROXY,
            service=SERVICE,
            proxy_id=PROXY_CN.split(".")[0],
            csr_pem=CSR,
        )
    )
    for certificate in (issued, proxy):
        common_name = certificate.info.common_name
        found = await stub.GetCertificateInfo(pb.GetCertificateRequest(common_name=common_name))
        assert found == certificate.info
        assert b"PRIVATE KEY" not in found.SerializeToString()
    assert proxy.info.common_name == PROXY_CN
    assert proxy.info.service_account == "bookstore"


async def test_certificate_info_of_an_unknown_name_is_not_found(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetCertificateInfo(
            pb.GetCertificateRequest(common_name="nobody.bookstore.svc.cluster.local")
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == (
        "no certificate with common name 'nobody.bookstore.svc.cluster.local'"
    )


@pytest.mark.parametrize("common_name", ["", "not a name", "a.b.svc.", "x" * 65])
async def test_certificate_info_of_a_malformed_name_is_refused_naming_the_field(
    stub: pb_grpc.CertificateManagerAsyncStub, health: Health, common_name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.GetCertificateInfo(pb.GetCertificateRequest(common_name=common_name))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("common_name: ")
    assert [(r.source, r.key) for r in health.rejections.items()] == [
        ("grpc", "GetCertificateInfo")
    ]


async def test_a_proxy_certificate_for_an_invalid_service_account_is_refused_and_not_stored(
    stub: pb_grpc.CertificateManagerAsyncStub,
    store: InMemoryCertificateStore,
    health: Health,
    metrics: CollectorRegistry,
) -> None:
    request = pb.IssueCertificateRequest(
        kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, service_account="Bad Name!", csr_pem=CSR
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.IssueCertificate(request)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        "service_account: 'Bad Name!' is not a valid DNS-1123 subdomain: must consist of lower "
        "case alphanumeric characters, '-' or '.', and each dot-separated label must start and "
        "end with an alphanumeric character"
    )
    assert store.records == {}
    assert [(r.source, r.key) for r in health.rejections.items()] == [("grpc", "IssueCertificate")]
    assert metrics.get_sample_value("trellis_rejected_records_total", {"source": "grpc"}) == 1


async def _proxy(stub: pb_grpc.CertificateManagerAsyncStub) -> pb.Certificate:
    issued: pb.Certificate = await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, csr_pem=CSR)
    )
    return issued


async def test_a_renewal_certifies_the_new_key_for_the_same_name_and_revokes_the_old_serial(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    issued = await _proxy(stub)
    new_key_ = new_key()[1]
    renewed = await stub.RenewProxyCertificate(
        pb.RenewProxyCertificateRequest(
            common_name=issued.info.common_name,
            serial=issued.info.serial,
            csr_pem=csr_for(new_key_, "renewal"),
        )
    )
    leaf = x509.load_pem_x509_certificate(renewed.cert_chain_pem)
    assert (renewed.info.common_name, renewed.private_key_pem) == (issued.info.common_name, b"")
    assert leaf.public_key() == new_key_.public_key()
    workload = x509.load_pem_x509_certificate(renewed.workload_cert_chain_pem)
    assert workload.public_key() == new_key_.public_key()  # renewed with it, for the new key
    assert workload.not_valid_after_utc == leaf.not_valid_after_utc
    revoked = await stub.ListRevokedCertificates(
        pb.ListRevokedCertificatesRequest(common_name=issued.info.common_name)
    )
    assert [(r.serial, r.reason) for r in revoked.revoked] == [(issued.info.serial, "rotated")]


async def test_a_renewal_with_a_replaced_serial_is_failed_precondition_and_issues_nothing(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    issued = await _proxy(stub)
    renew = pb.RenewProxyCertificateRequest(
        common_name=issued.info.common_name, serial=issued.info.serial, csr_pem=CSR
    )
    current = await stub.RenewProxyCertificate(renew)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RenewProxyCertificate(renew)  # the same, now stale, certificate again
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    info = await stub.GetCertificateInfo(
        pb.GetCertificateRequest(common_name=issued.info.common_name)
    )
    assert info.serial == current.info.serial


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (pb.RenewProxyCertificateRequest(serial="1", csr_pem=CSR), "common_name: is required"),
        (
            pb.RenewProxyCertificateRequest(common_name="x.svc", serial="1", csr_pem=CSR),
            "common_name: ",
        ),
        (
            pb.RenewProxyCertificateRequest(common_name=PROXY_CN, serial="zz", csr_pem=CSR),
            "serial: must be the presented certificate's serial in hex",
        ),
        (
            pb.RenewProxyCertificateRequest(common_name=PROXY_CN, serial="1", csr_pem=b"junk"),
            "csr_pem: not a PEM certificate signing request",
        ),
    ],
)
async def test_a_bad_renewal_request_is_refused_naming_the_field(
    stub: pb_grpc.CertificateManagerAsyncStub,
    health: Health,
    request_: pb.RenewProxyCertificateRequest,
    message: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RenewProxyCertificate(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(message)
    assert [r.key for r in health.rejections.items()] == ["RenewProxyCertificate"]


async def test_renewing_an_unknown_proxy_is_not_found(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.RenewProxyCertificate(
            pb.RenewProxyCertificateRequest(common_name=PROXY_CN, serial="1", csr_pem=CSR)
        )
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def _issue(**fields: object) -> pb.IssueCertificateRequest:
    base: dict[str, object] = {"kind": pb.CERTIFICATE_KIND_SERVICE, "service": SERVICE}
    return pb.IssueCertificateRequest(**{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rpc", "request_", "message"),
    [
        (
            "IssueCertificate",
            _issue(service_account="Bad Name!"),
            "service_account: 'Bad Name!' is not a valid DNS-1123 subdomain",
        ),
        (
            "IssueCertificate",
            _issue(kind=7),
            "kind: must be one of CERTIFICATE_KIND_SERVICE, CERTIFICATE_KIND_PROXY, got 7",
        ),
        (
            "IssueCertificate",
            _issue(service=pb.MeshService(namespace="bookstore", name="")),
            "service.name: is required",
        ),
        (
            "IssueCertificate",
            _issue(proxy_id="123e4567-e89b-42d3-a456-426614174000"),
            "proxy_id: only proxy certificates have a proxy id",
        ),
        (
            "IssueCertificate",
            _issue(
                kind=pb.CERTIFICATE_KIND_PROXY,
                service=pb.MeshService(namespace="bookstore-ns", name="bookstore-service"),
                csr_pem=CSR,
            ),
            "service: proxy common name '",
        ),
        (
            "IssueCertificate",
            _issue(validity=duration_pb2.Duration(seconds=-60)),
            "validity: must not be negative, got -60s 0ns",
        ),
        (
            "IssueCertificate",
            _issue(validity=duration_pb2.Duration(seconds=2**62)),
            "validity: must be at most 3650 days, 0:00:00",
        ),
        (
            "IssueCertificate",
            _issue(service=pb.MeshService(namespace="bookstore", name="b" * 60)),
            "service: service common name 'bbbb",  # the issuer's check, with the trust domain
        ),
        (
            "GetCertificate",
            pb.GetCertificateRequest(common_name="Bad Name!"),
            "common_name: 'Bad Name!' is not a certificate common name",
        ),
        (
            "GetCertificate",
            pb.GetCertificateRequest(),
            "common_name: is required",
        ),
        (
            "RotateCertificate",
            pb.RotateCertificateRequest(common_name=PROXY_CN.upper()),
            "common_name: '123E4567",
        ),
        (
            "ListCertificates",
            pb.ListCertificatesRequest(kind=pb.CertificateKind.ValueType(5)),
            "kind: must be one of CERTIFICATE_KIND_UNSPECIFIED (all), CERTIFICATE_KIND_SERVICE,",
        ),
        (
            "ListCertificates",
            pb.ListCertificatesRequest(namespace="Bad Name!"),
            "namespace: 'Bad Name!' is not a valid DNS-1123 label",
        ),
    ],
)
async def test_every_rpc_refuses_invalid_requests_naming_the_field_and_counts_them(
    stub: pb_grpc.CertificateManagerAsyncStub,
    store: InMemoryCertificateStore,
    health: Health,
    metrics: CollectorRegistry,
    rpc: str,
    request_: object,
    message: str,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await getattr(stub, rpc)(request_)

    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert details.startswith(message)
    assert [(r.key, r.reason) for r in health.rejections.items()] == [(rpc, details)]
    assert metrics.get_sample_value("trellis_rejected_records_total", {"source": "grpc"}) == 1
    assert store.records == {}


async def test_well_formed_requests_still_work_after_refusals(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.IssueCertificate(_issue(service_account="Bad Name!"))
    issued = await stub.IssueCertificate(
        _issue(kind=pb.CERTIFICATE_KIND_PROXY, service_account="bookstore.sa", csr_pem=CSR)
    )
    assert issued.info.service_account == "bookstore.sa"
    listed = await stub.ListCertificates(pb.ListCertificatesRequest(namespace="bookstore"))
    assert [c.common_name for c in listed.certificates] == [issued.info.common_name]


async def test_a_store_outage_is_unavailable_and_issues_nothing(
    stub: pb_grpc.CertificateManagerAsyncStub, store: InMemoryCertificateStore
) -> None:
    store.down = True
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.IssueCertificate(
            pb.IssueCertificateRequest(
                kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, service_account="bookstore"
            )
        )
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert store.records == {}
