"""Revoking a component's certificates: every service refuses them at once, and the
component exits to join again with a new key.

certmanager, endpoints-vm and the catalog run as processes beside a real Redis. The test
holds a certificate of the catalog's identity (joined as the catalog, as a thief with a
copy of its key would hold one), revokes the catalog with ``trellis identity revoke``, and
checks each refusal (reason ``revoked``, logged and counted), the catalog process ending,
and a fresh join being accepted again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from trellis_api import certmanager_pb2, certmanager_pb2_grpc, endpoints_pb2, endpoints_pb2_grpc
from trellis_common.identity import ComponentIdentity
from trellis_common.testing import RedisServer
from trellis_common.testing.identities import join_as
from trellis_common.testing.services import ServiceProcess, running, trellis
from trellis_common.testing.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def services(state_dir: Path, redis_server: RedisServer) -> Iterator[dict[str, ServiceProcess]]:
    processes = {
        name: ServiceProcess(name, module, state_dir, redis_server)
        for name, module in (
            ("certmanager", "trellis_certmanager.main"),
            ("endpoints-vm", "trellis_endpoints_vm.main"),
            ("catalog", "trellis_catalog.main"),
        )
    }
    with running(processes):
        yield processes


def revoked_refusals(process: ServiceProcess) -> float:
    found = re.findall(
        r'trellis_grpc_refusals_total\{caller="catalog",method="[^"]*",reason="revoked"\} (\S+)',
        process.get("/metrics").text,
    )
    return sum(float(n) for n in found)


async def list_services(identity: ComponentIdentity, provider: ServiceProcess) -> None:
    address = provider.endpoint.grpc_address
    async with identity.channel(address, "endpoints-vm") as channel:
        stub = endpoints_pb2_grpc.EndpointsProviderStub(channel)
        await stub.ListServices(endpoints_pb2.ListServicesRequest(), timeout=5)


async def list_certificates(identity: ComponentIdentity, certmanager: ServiceProcess) -> None:
    async with identity.channel(certmanager.endpoint.grpc_address, "certmanager") as channel:
        stub = certmanager_pb2_grpc.CertificateManagerStub(channel)
        await stub.ListCertificates(certmanager_pb2.ListCertificatesRequest(), timeout=5)


async def test_a_revoked_component_is_refused_everywhere_and_joins_again(
    services: dict[str, ServiceProcess], state_dir: Path
) -> None:
    certmanager, provider, catalog = (
        services["certmanager"],
        services["endpoints-vm"],
        services["catalog"],
    )
    stolen = join_as(state_dir, "catalog")
    await list_services(stolen, provider)  # good until revoked
    await list_certificates(stolen, certmanager)

    done = trellis(state_dir, "identity", "revoke", "catalog", "--json")
    assert done.returncode == 0, done.stderr
    stolen_serial = f"{stolen.material.leaf.serial_number:x}"
    assert stolen_serial in done.stdout

    # certmanager refuses it at once; endpoints-vm as soon as its follower has the signal
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await list_certificates(stolen, certmanager)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert caught.value.details() == f"the certificate {stolen_serial} of catalog was revoked"

    async def refused_by_the_provider() -> bool:
        try:
            await list_services(stolen, provider)
        except grpc.aio.AioRpcError as exc:
            return exc.code() == grpc.StatusCode.PERMISSION_DENIED
        return False

    await eventually(refused_by_the_provider, timeout=10, message="endpoints-vm refuses it")
    assert revoked_refusals(certmanager) >= 1
    assert revoked_refusals(provider) >= 1
    assert "reason=revoked" in provider.logs()

    # the catalog's own certificate was among them: it says so and exits
    process = catalog.process
    assert process is not None
    await eventually(lambda: process.poll() is not None, timeout=15, message="catalog exits")
    assert "identity.revoked component=catalog" in catalog.logs()

    # a new join (what `trellis up` does on the restart) gets a certificate that works
    fresh = join_as(state_dir, "catalog")
    await list_services(fresh, provider)
    listed = trellis(state_dir, "identity", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert stolen_serial in listed.stdout
