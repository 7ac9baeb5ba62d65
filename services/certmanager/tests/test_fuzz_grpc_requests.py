"""Fuzzing certmanager's gRPC requests: the checks alone, then the servicer behind them.

Requests are any protobuf messages of each RPC's type (names valid, nearly valid or junk;
enums any int32; sub-messages present or not). Promises: a check returns or raises
``InvalidField`` naming one of the request's fields; the servicer answers, or ends the call
with INVALID_ARGUMENT naming a field (and records the rejection) or NOT_FOUND; nothing else
escapes, and nothing invalid is stored.
"""

from __future__ import annotations

from google.protobuf import duration_pb2
from google.protobuf.message import Message
from hypothesis import event, example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2 as pb
from trellis_certmanager.domain.authority import CertificateAuthority
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_certmanager.transport import grpc_requests
from trellis_certmanager.transport.grpc_api import CertificateManagerServicer
from trellis_common.ids import ProxyCommonName, SpiffeId
from trellis_common.model import MeshService
from trellis_identity.identity import csr_for, new_key
from trellis_runtime.health import Health
from trellis_testing import strategies as fuzz
from trellis_testing.servicer import Checks, answers_or_refuses, check_names_a_field

SERVICE = pb.MeshService(namespace="shop", name="cart")
ISSUE_FIELDS = {
    "kind",
    "service",
    "service.namespace",
    "service.name",
    "service_account",
    "proxy_id",
    "validity",
    "csr_pem",
}
# The checks of each RPC, and the fields its refusals may name.
CHECKS: Checks = {
    "IssueCertificate": (pb.IssueCertificateRequest, grpc_requests.issue, ISSUE_FIELDS),
    "GetCertificate": (pb.GetCertificateRequest, grpc_requests.common_name, {"common_name"}),
    "GetCertificateInfo": (pb.GetCertificateRequest, grpc_requests.common_name, {"common_name"}),
    "RotateCertificate": (
        pb.RotateCertificateRequest,
        grpc_requests.common_name,
        {"common_name"},
    ),
    "ListCertificates": (
        pb.ListCertificatesRequest,
        grpc_requests.list_filter,
        {"kind", "namespace"},
    ),
}


CSR_PEM = csr_for(new_key()[1], "a proxy")
CART_CN = "cart.shop.svc.cluster.local"  # issued before each servicer example
STRINGS = fuzz.mostly(st.one_of(fuzz.plausible_names(), st.just(CART_CN)), fuzz.names())


# Issue requests field by field, each field mostly valid: deep enough to issue certificates.
ISSUES = st.builds(
    pb.IssueCertificateRequest,
    kind=fuzz.mostly(
        st.sampled_from([pb.CERTIFICATE_KIND_SERVICE, pb.CERTIFICATE_KIND_PROXY]),
        st.integers(-(2**31), 2**31 - 1),
    ),
    service=fuzz.mostly(
        st.builds(
            pb.MeshService,
            namespace=fuzz.mostly(fuzz.dns_labels(), fuzz.names()),
            name=fuzz.mostly(fuzz.dns_labels(), fuzz.names()),
        ),
        st.none(),
    ),
    service_account=fuzz.mostly(st.one_of(st.just(""), fuzz.dns_subdomains()), fuzz.names()),
    proxy_id=fuzz.mostly(st.one_of(st.just(""), fuzz.proxy_ids()), fuzz.names()),
    validity=st.one_of(
        st.none(),
        st.builds(
            duration_pb2.Duration,
            seconds=fuzz.mostly(st.integers(0, 10**9), st.integers(-(2**63), 2**63 - 1)),
            nanos=fuzz.mostly(st.just(0), st.integers(-(2**31), 2**31 - 1)),
        ),
    ),
    omit_private_key=st.booleans(),
    # mostly a good CSR (proxy certificates need one; service certificates refuse one)
    csr_pem=fuzz.mostly(st.sampled_from([CSR_PEM, b""]), st.binary(max_size=64)),
)


def requests() -> st.SearchStrategy[tuple[str, Message]]:
    anything = st.sampled_from(sorted(CHECKS)).flatmap(
        lambda rpc: st.tuples(st.just(rpc), fuzz.messages(CHECKS[rpc][0], strings=STRINGS))
    )
    return st.one_of(anything, st.tuples(st.just("IssueCertificate"), ISSUES))


@given(asked=requests())
@example(
    asked=(
        "IssueCertificate",
        pb.IssueCertificateRequest(validity=duration_pb2.Duration(seconds=2**62)),
    )
)
@example(asked=("ListCertificates", pb.ListCertificatesRequest(kind=-7)))  # type: ignore[arg-type]
def test_checks_return_or_name_a_field_of_the_request(asked: tuple[str, Message]) -> None:
    check_names_a_field(CHECKS, *asked)


@given(asked=requests())
@example(
    asked=(
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_PROXY,
            service=SERVICE,
            service_account="Bad Name!",
            csr_pem=CSR_PEM,
        ),
    )
)
@example(
    asked=(
        "IssueCertificate",
        pb.IssueCertificateRequest(
            kind=pb.CERTIFICATE_KIND_SERVICE,
            service=SERVICE,
            validity=duration_pb2.Duration(seconds=-(2**63)),
        ),
    )
)
async def test_the_servicer_answers_or_refuses_naming_a_field_and_stores_only_valid_records(
    root_ca: CertificateAuthority, asked: tuple[str, Message]
) -> None:
    rpc, request = asked
    store = InMemoryCertificateStore()
    store.ca = root_ca

    async def bell(kind: str, key: str) -> int:
        return 1

    manager = CertificateManager(
        store,
        bell,
        IssuancePolicy(),
        KeyAlgorithm.ECDSA_P256,
        CertMetrics(CollectorRegistry()),
    )
    await manager.start()
    await manager.issue_service(MeshService("shop", "cart"))
    health = Health()
    servicer = CertificateManagerServicer(manager, health.rejections)

    aborted = await answers_or_refuses(
        servicer,
        rpc,
        request,
        health.rejections,
        CHECKS,
        not_a_check=("service: service common name",),  # the issuer's
    )

    event(f"{rpc} {aborted.code.name if aborted else 'OK'}")
    for record in store.records.values():  # what certmanager stored, the catalog can use
        SpiffeId("cluster.local", record.namespace, record.service_account or record.service)
        if record.proxy_id:
            assert ProxyCommonName.parse(record.common_name).proxy_id == record.proxy_id
