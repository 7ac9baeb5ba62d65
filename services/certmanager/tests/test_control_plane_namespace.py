"""No service certificate in the control plane's namespace: its names are the components'.

proxy-cp used to ask for a service certificate of ``trellis-system/proxy-cp`` and serve xDS
with it: a second proxy-cp identity that ``trellis identity revoke proxy-cp`` did not
reach. That request is now refused (logged with the caller, counted), and records an
earlier version made there are adopted as the components' certificates (so revoking the
component reaches them) and dropped.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable

import grpc
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from trellis_api import certmanager_pb2 as pb
from trellis_api import certmanager_pb2_grpc as pb_grpc
from trellis_certmanager.componentcerts import ComponentCertificates
from trellis_certmanager.domain.issuer import IssuancePolicy
from trellis_certmanager.domain.keys import KeyAlgorithm
from trellis_certmanager.domain.records import CertificateKind
from trellis_certmanager.main import adopt_control_plane_records
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.metrics import CertMetrics
from trellis_certmanager.testing import InMemoryCertificateStore
from trellis_certmanager.transport.grpc_api import SERVICE_NAME, CertificateManagerServicer
from trellis_common.model import MeshService
from trellis_runtime.grpcserver import GrpcServer
from trellis_testing.bell import Bell
from trellis_testing.identities import LocalCA

PROXY_CP_URI = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"


def asked(namespace: str, name: str) -> pb.IssueCertificateRequest:
    return pb.IssueCertificateRequest(
        kind=pb.CERTIFICATE_KIND_SERVICE,
        service=pb.MeshService(namespace=namespace, name=name),
        service_account=name,
    )


async def test_proxy_cp_s_old_path_a_trellis_system_service_certificate_is_refused(
    store: InMemoryCertificateStore,
    bell: Bell,
    clock: Callable[[], dt.datetime],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The attack: proxy-cp (or whoever holds its key) asks certmanager for a service
    certificate that names proxy-cp, or another component, with its key."""
    registry = CollectorRegistry()
    manager = CertificateManager(
        store, bell, IssuancePolicy(), KeyAlgorithm.ECDSA_P256, CertMetrics(registry), clock=clock
    )
    await manager.start()
    servicer = CertificateManagerServicer(manager)
    ca = LocalCA()
    server = GrpcServer(
        "127.0.0.1:0",
        [lambda s: pb_grpc.add_CertificateManagerServicer_to_server(servicer, s)],
        [SERVICE_NAME],
        credentials=ca.identity("certmanager").server_credentials(),
        grace=0.1,
    )
    port = await server.start()
    try:
        as_proxy_cp = ca.identity("proxy-cp")
        with caplog.at_level(logging.WARNING, "trellis_certmanager.manager"):
            async with as_proxy_cp.channel(f"127.0.0.1:{port}", "certmanager") as channel:
                stub = pb_grpc.CertificateManagerStub(channel)
                codes = []
                for name in ("proxy-cp", "certmanager", "redis"):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.IssueCertificate(asked("trellis-system", name))
                    codes.append(caught.value.code())
                    assert "the control plane's namespace" in (caught.value.details() or "")
                fine = await stub.IssueCertificate(asked("shop", "cart"))  # anywhere else
    finally:
        await server.server.stop(None)

    assert codes == [grpc.StatusCode.PERMISSION_DENIED] * 3
    assert fine.info.uris == ["spiffe://cluster.local/ns/shop/sa/cart"]
    counted = registry.get_sample_value(
        "trellis_certmanager_issue_refused_total",
        {"kind": "service", "reason": "control_plane_namespace"},
    )
    assert counted == 3.0
    assert (
        "cert.refused kind=service reason=control_plane_namespace "
        f"service=trellis-system/proxy-cp requester={PROXY_CP_URI}"
    ) in caplog.text
    assert [r.namespace for r in manager.list()] == ["shop"]  # nothing issued there


async def test_what_an_earlier_version_issued_there_is_revocable_then_dropped(
    store: InMemoryCertificateStore,
    bell: Bell,
    redis_client: redis.asyncio.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """proxy-cp's old serving certificate (and one that named two components) are recorded
    as the components' before they are dropped: revoking proxy-cp revokes them too."""
    manager = CertificateManager(
        store, bell, IssuancePolicy(), KeyAlgorithm.ECDSA_P256, CertMetrics(CollectorRegistry())
    )  # the clock of main's adoption: real time
    await manager.start()
    made = await manager.issue_service(MeshService("shop", "proxy-cp"), "proxy-cp")
    other = await manager.issue_service(MeshService("shop", "catalog"), "proxy-cp")
    # as an earlier version stored them: trellis-system's
    for record in (made, other):
        await store.put(
            dataclasses.replace(
                record,
                namespace="trellis-system",
                common_name=record.common_name.replace(".shop.", ".trellis-system."),
            )
        )
    await store.delete_many([made.common_name, other.common_name])
    restarted = CertificateManager(
        store, bell, IssuancePolicy(), KeyAlgorithm.ECDSA_P256, CertMetrics(CollectorRegistry())
    )
    await restarted.start()
    assert len(restarted.list(CertificateKind.SERVICE)) == 2
    certs = ComponentCertificates(redis_client, lambda: dt.datetime.now(dt.UTC))
    await certs.load()

    with caplog.at_level(logging.WARNING):
        await adopt_control_plane_records(restarted, certs)

    assert restarted.list() == []  # never served or rotated again
    assert (await store.load_all()).records == []
    serials = {f"{made.serial:x}", f"{other.serial:x}"}
    assert set(certs.issued) == serials
    assert certs.issued[f"{other.serial:x}"].also == ("catalog",)
    assert "reason=control_plane_namespace" in caplog.text
    again = ComponentCertificates(redis_client, lambda: dt.datetime.now(dt.UTC))
    await again.load()  # recorded durably: a restart can still revoke them
    assert set(again.issued) == serials

    revoked = await again.revoke("proxy-cp")
    assert {c.serial for c in revoked} == serials
    assert all(again.is_revoked(s) for s in serials)
    assert await again.revoke("catalog") == []  # the second was revoked with proxy-cp already
