"""The gRPC API over a real grpc.aio server and client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from cryptography import x509
from google.protobuf import duration_pb2

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.transport.grpc_api import SERVICE_NAME, CertificateManagerServicer
from trellis_common.grpcserver import GrpcServer

SERVICE = pb.MeshService(namespace="bookstore", name="bookstore")


@pytest.fixture
async def stub(manager: CertificateManager) -> AsyncIterator[pb_grpc.CertificateManagerAsyncStub]:
    server = GrpcServer(
        "127.0.0.1:0",
        [
            lambda s: pb_grpc.add_CertificateManagerServicer_to_server(
                CertificateManagerServicer(manager), s
            )
        ],
        [SERVICE_NAME],
        grace=0.1,
    )
    stop = asyncio.Event()
    await server.start()
    task = asyncio.create_task(server.run(stop))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield pb_grpc.CertificateManagerStub(channel)
    stop.set()
    await task


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
        )
    )
    lifetime = issued.info.not_after.ToDatetime() - issued.info.not_before.ToDatetime()
    assert 3600 <= lifetime.total_seconds() <= 3660
    assert issued.info.kind == pb.CERTIFICATE_KIND_PROXY
    assert issued.info.proxy_id
    assert issued.info.common_name.startswith(issued.info.proxy_id)


async def test_list_carries_no_keys_and_filters(stub: pb_grpc.CertificateManagerAsyncStub) -> None:
    await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE)
    )
    await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE)
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
                kind=pb.CERTIFICATE_KIND_PROXY, service=SERVICE, proxy_id="123"
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


async def test_unknown_certificate_is_not_found(stub: pb_grpc.CertificateManagerAsyncStub) -> None:
    for call in (
        stub.GetCertificate(pb.GetCertificateRequest(common_name="nope")),
        stub.RotateCertificate(pb.RotateCertificateRequest(common_name="nope")),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        assert "nope" in (caught.value.details() or "")


async def test_watch_starts_with_a_snapshot_then_streams_changes(
    stub: pb_grpc.CertificateManagerAsyncStub,
) -> None:
    issued = await stub.IssueCertificate(
        pb.IssueCertificateRequest(kind=pb.CERTIFICATE_KIND_SERVICE, service=SERVICE)
    )
    stream = stub.WatchCertificates(pb.WatchCertificatesRequest())
    events = aiter(stream)
    first = await anext(events)
    assert first.kind == pb.CertificateEvent.SNAPSHOT
    assert first.revision == 1
    await stub.RotateCertificate(pb.RotateCertificateRequest(common_name=issued.info.common_name))
    second = await asyncio.wait_for(anext(events), 2)
    assert second.kind == pb.CertificateEvent.ROTATED
    assert second.common_name == issued.info.common_name
    assert second.revision == 2
    assert second.info.serial != issued.info.serial
    assert b"PRIVATE KEY" not in second.SerializeToString()
    stream.cancel()
