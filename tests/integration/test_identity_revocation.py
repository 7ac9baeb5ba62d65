"""Revoking a component's certificates: every service refuses them at once, and the
component exits to join again with a new key.

certmanager, endpoints-vm and the catalog run as processes beside a real Redis. The test
holds a certificate of the catalog's identity (joined as the catalog, as a thief with a
copy of its key would hold one), revokes the catalog with ``trellis identity revoke``, and
checks each refusal (reason ``revoked``, logged and counted), the catalog process ending,
and a fresh join being accepted again.

The second test is proxy-cp's: what its xDS, Destination and enrollment ports serve is its
component certificate (no second, service certificate that revocation would not reach: the
old way of getting one is refused, logged and counted), so revoking proxy-cp ends that
certificate's service and the restarted proxy-cp serves a new one.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from trellis_api import certmanager_pb2, certmanager_pb2_grpc, endpoints_pb2, endpoints_pb2_grpc
from trellis_common import components
from trellis_identity import servercheck
from trellis_identity.identity import ComponentIdentity
from trellis_testing import RedisServer
from trellis_testing.identities import join_as
from trellis_testing.ports import free_port
from trellis_testing.services import ServiceProcess, running, trellis
from trellis_testing.waiting import eventually

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


PROXY_CP_URI = "spiffe://cluster.local/ns/trellis-system/sa/proxy-cp"


@pytest.fixture
def with_proxy_cp(
    state_dir: Path, redis_server: RedisServer
) -> Iterator[tuple[dict[str, ServiceProcess], dict[str, str]]]:
    host = "127.0.0.1"
    ports = {"destination": f"{host}:{free_port()}", "enrollment": f"{host}:{free_port()}"}
    proxy_cp = ServiceProcess(
        "proxy-cp",
        "trellis_proxy_cp.main",
        state_dir,
        redis_server,
        ("--xds-host", host),
        env={
            "TRELLIS_PROXY_CP_DESTINATION_PORT": ports["destination"].rsplit(":", 1)[1],
            "TRELLIS_PROXY_CP_ENROLL_PORT": ports["enrollment"].rsplit(":", 1)[1],
        },
    )
    processes = {
        name: ServiceProcess(name, module, state_dir, redis_server)
        for name, module in (
            ("certmanager", "trellis_certmanager.main"),
            ("endpoints-vm", "trellis_endpoints_vm.main"),
            ("catalog", "trellis_catalog.main"),
        )
    }
    processes["proxy-cp"] = proxy_cp
    with running(processes):
        ports["xds"] = proxy_cp.endpoint.grpc_address
        yield processes, ports


def served(address: str, client: ComponentIdentity) -> x509.Certificate:
    """What a port of proxy-cp serves, checked as its clients check it: the mesh CA, the
    name proxy-cp.trellis-system.svc and proxy-cp's SPIFFE id."""
    material = client.material
    return servercheck.verify_server(
        address,
        components.server_name("proxy-cp"),
        PROXY_CP_URI,
        material.trust_bundle_pem,
        material.cert_chain_pem,
        material.key_pem,
    )


def issued_to(state_dir: Path, component: str) -> set[str]:
    listed = trellis(state_dir, "identity", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    return {c["serial"] for c in json.loads(listed.stdout)["issued"] if c["component"] == component}


async def test_proxy_cp_serves_its_component_certificate_and_revoking_it_rotates_what_it_serves(
    with_proxy_cp: tuple[dict[str, ServiceProcess], dict[str, str]], state_dir: Path
) -> None:
    services, ports = with_proxy_cp
    certmanager, proxy_cp = services["certmanager"], services["proxy-cp"]
    client = join_as(state_dir, "injector")  # any mesh certificate gets through TLS

    # every port serves proxy-cp's component certificate, the one it joined with
    first = {port: served(address, client).serial_number for port, address in ports.items()}
    assert len(set(first.values())) == 1
    serial = f"{first['xds']:x}"
    assert serial in issued_to(state_dir, "proxy-cp")

    # the old way to a second identity: a service certificate of trellis-system/proxy-cp
    stolen = join_as(state_dir, "proxy-cp")
    request = certmanager_pb2.IssueCertificateRequest(
        kind=certmanager_pb2.CERTIFICATE_KIND_SERVICE,
        service=certmanager_pb2.MeshService(namespace="trellis-system", name="proxy-cp"),
        service_account="proxy-cp",
        omit_private_key=True,  # the cell proxy-cp holds: a service key is no one's
    )
    async with stolen.channel(certmanager.endpoint.grpc_address, "certmanager") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await certmanager_pb2_grpc.CertificateManagerStub(channel).IssueCertificate(request)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "the control plane's namespace" in (caught.value.details() or "")
    metrics = certmanager.get("/metrics").text
    assert (
        'trellis_certmanager_issue_refused_total{kind="service",'
        'reason="control_plane_namespace"} 1.0'
    ) in metrics
    assert (
        "cert.refused kind=service reason=control_plane_namespace "
        f"service=trellis-system/proxy-cp requester={PROXY_CP_URI}"
    ) in certmanager.logs()

    # revoking proxy-cp reaches what it serves: the process ends, its ports with it...
    done = trellis(state_dir, "identity", "revoke", "proxy-cp", "--json")
    assert done.returncode == 0, done.stderr
    assert serial in done.stdout
    process = proxy_cp.process
    assert process is not None
    await eventually(lambda: process.poll() is not None, timeout=15, message="proxy-cp exits")
    assert "identity.revoked component=proxy-cp" in proxy_cp.logs()
    with pytest.raises(servercheck.Unreachable):
        await asyncio.to_thread(served, ports["xds"], client)

    # ...and the restarted proxy-cp serves a new certificate on every port
    proxy_cp.start(ports=(int(ports["xds"].rsplit(":", 1)[1]), 0))  # as its supervisor does
    again = {port: served(address, client).serial_number for port, address in ports.items()}
    assert len(set(again.values())) == 1
    assert again["xds"] != first["xds"]
    assert f"{again['xds']:x}" in issued_to(state_dir, "proxy-cp")
