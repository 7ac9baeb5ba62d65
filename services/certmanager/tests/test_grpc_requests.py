"""The checks of certmanager's RPCs: what a well-formed request becomes."""

from __future__ import annotations

import datetime as dt

import pytest
from google.protobuf import duration_pb2

from trellis_api import certmanager_pb2 as pb
from trellis_certmanager.domain.records import CertificateKind
from trellis_certmanager.transport import grpc_requests
from trellis_common.model import MeshService
from trellis_identity.identity import csr_for, new_key
from trellis_runtime.grpcrequests import InvalidField

SERVICE = pb.MeshService(namespace="shop", name="cart")
UUID = "123e4567-e89b-42d3-a456-426614174000"
KEY = new_key()[1]
CSR = csr_for(KEY, "the proxy's own")


def test_a_service_certificate_request() -> None:
    asked = grpc_requests.issue(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE,
            service=SERVICE,
            service_account="cart.sa",
            validity=duration_pb2.Duration(seconds=3600, nanos=500_000),
            omit_private_key=True,
        )
    )
    assert asked == grpc_requests.Issue(
        CertificateKind.SERVICE,
        MeshService("shop", "cart"),
        "cart.sa",
        "",
        dt.timedelta(hours=1, microseconds=500),
        True,
    )


def test_a_proxy_certificate_request_with_and_without_an_id() -> None:
    made = grpc_requests.issue(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, csr_pem=CSR)
    )
    assert (made.kind, made.proxy_id, made.service_account, made.validity) == (
        CertificateKind.PROXY,
        "",
        "",
        None,
    )
    given = grpc_requests.issue(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, proxy_id=UUID, csr_pem=CSR
        )
    )
    assert given.proxy_id == UUID


def test_a_zero_validity_means_the_default() -> None:
    asked = grpc_requests.issue(
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, validity=duration_pb2.Duration()
        )
    )
    assert asked.validity is None


@pytest.mark.parametrize(
    ("validity", "message"),
    [
        (duration_pb2.Duration(seconds=59), "validity: must be at least 0:01:00, got 0:00:59"),
        (duration_pb2.Duration(seconds=1, nanos=-1), "validity: must not be negative"),
        (duration_pb2.Duration(nanos=2_000_000_000), "validity: nanos must be below 1000000000"),
        (duration_pb2.Duration(seconds=3651 * 86400), "validity: must be at most 3650 days"),
    ],
)
def test_validities_out_of_range(validity: duration_pb2.Duration, message: str) -> None:
    request = pb.IssueCertificateRequest(
        kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE, validity=validity
    )
    with pytest.raises(InvalidField, match=r"^validity: ") as caught:
        grpc_requests.issue(request)
    assert str(caught.value).startswith(message)


def test_common_names_of_both_kinds() -> None:
    for name in (f"{UUID}.cart.shop", "cart.shop.svc.cluster.local"):
        assert grpc_requests.common_name(pb.GetCertificateRequest(common_name=name)) == name
        assert grpc_requests.common_name(pb.RotateCertificateRequest(common_name=name)) == name


def test_list_filters() -> None:
    assert grpc_requests.list_filter(pb.ListCertificatesRequest()) == (None, "")
    assert grpc_requests.list_filter(
        pb.ListCertificatesRequest(kind=pb.CERTIFICATE_KIND_PROXY, namespace="shop")
    ) == (CertificateKind.PROXY, "shop")


def test_a_proxy_certificate_is_for_the_key_of_its_csr() -> None:
    asked = grpc_requests.issue(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, csr_pem=CSR)
    )
    assert asked.public_key is not None
    assert asked.public_key.public_numbers() == KEY.public_key().public_numbers()


@pytest.mark.parametrize(
    ("kind", "csr_pem", "reason"),
    [
        (pb.CERTIFICATE_KIND_PROXY, b"", "is required for CERTIFICATE_KIND_PROXY"),
        (pb.CERTIFICATE_KIND_PROXY, b"-----BEGIN JUNK-----", "not a PEM certificate signing"),
        (pb.CERTIFICATE_KIND_PROXY, CSR.replace(b"A", b"B", 1), ""),  # altered: no longer valid
        (pb.CERTIFICATE_KIND_SERVICE, CSR, "only proxy certificates are issued for a CSR"),
    ],
    # named, not by the CSR: each process makes its own key, and pytest-xdist's workers must
    # collect the same test ids
    ids=["empty", "junk", "altered", "for-a-service"],
)
def test_a_missing_bad_or_misplaced_csr_is_refused_naming_csr_pem(
    kind: pb.CertificateKind.ValueType, csr_pem: bytes, reason: str
) -> None:
    with pytest.raises(InvalidField) as refused:
        grpc_requests.issue(pb.IssueCertificateRequest(kind=kind, service=SERVICE, csr_pem=csr_pem))
    assert refused.value.field == "csr_pem"
    assert reason in refused.value.reason
