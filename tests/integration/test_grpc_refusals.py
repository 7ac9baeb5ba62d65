"""Invalid requests to the real services: refused at the door, and an operator sees them.

certmanager, endpoints-vm and the catalog run as processes beside a real Redis; each gets
one request with a name that breaks the rules. Each answers INVALID_ARGUMENT naming the
field, stores nothing, and shows the refusal in ``/v1/status`` and in
``trellis_rejected_records_total{source="grpc"}``, as its main wires its Health in.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from trellis_api import (
    catalog_pb2,
    catalog_pb2_grpc,
    certmanager_pb2,
    certmanager_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
)
from trellis_identity.identity import csr_for, new_key
from trellis_testing import RedisServer
from trellis_testing.services import ServiceProcess, running

PROXY_CSR = csr_for(new_key()[1], "a proxy")  # a proxy made its key; certmanager signs it

pytestmark = pytest.mark.integration

BAD = "Bad Name!"


@pytest.fixture
def services(state_dir: Path, redis_server: RedisServer) -> Iterator[dict[str, ServiceProcess]]:
    processes = {
        name: ServiceProcess(name, module, state_dir, redis_server)
        for name, module in [
            ("certmanager", "trellis_certmanager.main"),
            ("endpoints-vm", "trellis_endpoints_vm.main"),
            ("catalog", "trellis_catalog.main"),
        ]
    }
    with running(processes):
        yield processes


async def refused(
    process: ServiceProcess, stub_class: Any, rpc: str, request: Any, caller: str
) -> str:
    """Call as ``caller``, a component the policy lets call ``rpc``: the request itself is
    what is refused."""
    async with process.channel(caller) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(stub_class(channel), rpc)(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return caught.value.details() or ""


def seen_by_an_operator(process: ServiceProcess, rpc: str, details: str) -> None:
    status = process.get("/v1/status").json()
    assert [(r["source"], r["key"], r["reason"]) for r in status["rejections"]] == [
        ("grpc", rpc, details)
    ]
    metrics = process.get("/metrics").text
    assert 'trellis_rejected_records_total{source="grpc"} 1.0' in metrics


async def test_each_service_refuses_a_bad_name_and_shows_it(
    services: dict[str, ServiceProcess],
) -> None:
    certmanager = services["certmanager"]
    details = await refused(
        certmanager,
        certmanager_pb2_grpc.CertificateManagerStub,
        "IssueCertificate",
        certmanager_pb2.IssueCertificateRequest(
            kind=certmanager_pb2.CERTIFICATE_KIND_PROXY,
            service=certmanager_pb2.MeshService(namespace="shop", name="cart"),
            service_account=BAD,
            csr_pem=PROXY_CSR,
        ),
        "injector",
    )
    assert details.startswith("service_account: 'Bad Name!' is not a valid DNS-1123 subdomain")
    seen_by_an_operator(certmanager, "IssueCertificate", details)
    listed = certmanager.get("/v1/certificates").json()
    assert listed["certificates"] == []

    provider = services["endpoints-vm"]
    details = await refused(
        provider,
        endpoints_pb2_grpc.EndpointsProviderStub,
        "GetService",
        endpoints_pb2.GetServiceRequest(
            service=endpoints_pb2.ServiceRef(namespace=BAD, name="cart")
        ),
        "catalog",
    )
    assert details.startswith("service.namespace: 'Bad Name!' is not a valid DNS-1123 label")
    seen_by_an_operator(provider, "GetService", details)

    catalog = services["catalog"]
    details = await refused(
        catalog,
        catalog_pb2_grpc.CatalogStub,
        "ExpectProxy",
        catalog_pb2.ExpectProxyRequest(
            common_name="00000000-0000-4000-8000-000000000001.cart.shop", service_account=BAD
        ),
        "injector",
    )
    assert details.startswith("service_account: 'Bad Name!' is not a valid DNS-1123 subdomain")
    seen_by_an_operator(catalog, "ExpectProxy", details)
    proxies = catalog.get("/v1/proxies").json()
    assert proxies["proxies"] == []
