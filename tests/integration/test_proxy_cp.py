"""proxy-cp with real Envoy sidecars: traffic, split, policy, mTLS, rotation, NACK, refusal.

Everything runs for real: Redis, certmanager, endpoints-vm, catalog and proxy-cp as
processes, Envoy 1.40 sidecars onboarded with proxy certificates, small HTTP apps behind
them, and HTTP requests sent through the sidecars.

The services (and their Redis, state directory and spec directory) start once for the
module, and its tests share them: each onboards its own sidecars (fresh Envoys, whose
statistics start at zero), and after each the sidecars and apps are stopped, workloads
deregistered and the spec's files restored, until the mesh answers as before the first test
(:class:`Baseline`). The rotation test rotates a service's certificate, which no proxy is
given and no other test reads: the baseline is the same after it.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from trellis_api import certmanager_pb2 as cm
from trellis_testing import eventually
from trellis_testing.baseline import BOOKSTORE_WORKLOADS, Baseline, module_mesh
from trellis_testing.mesh import BOOKSTORE, Mesh, Sidecar, bookstore

# one mesh for the module (its fixtures): its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("proxy-cp-mesh")]
MESH_NAME = "proxy-cp"

ROOT = Path(__file__).resolve().parents[2]


shared, mesh = module_mesh(
    MESH_NAME,
    ROOT / "examples" / "bookstore",
    Mesh,
    lambda mesh: Baseline(mesh, registered=BOOKSTORE_WORKLOADS),
)


def test_traffic_split_policy_and_mtls(mesh: Mesh) -> None:
    v1, _v2, buyer = bookstore(mesh)
    seen: Counter[str] = Counter()
    for _ in range(200):
        response = buyer.get(BOOKSTORE, "/books-bought")
        assert response.status_code == 200, response.text
        seen[response.json()["app"]] += 1
    # 80/20 split: 40 expected for v2, standard deviation ~5.7
    assert 20 <= seen["v2"] <= 60, seen
    assert seen["v1"] + seen["v2"] == 200

    caller = buyer.get(BOOKSTORE, "/books-bought").json()["caller"]
    assert "URI=spiffe://cluster.local/ns/bookbuyer/sa/bookbuyer" in caller

    # a path in no allowed HTTPRouteGroup match finds no route at the destination: 404, as
    # OSM answers (a route the caller is not allowed on is 403, below)
    assert buyer.get(BOOKSTORE, "/admin").status_code == 404
    # bookthief: no TrafficTarget, so no route at all from its sidecar
    thief = mesh.onboard("bookthief", "bookthief", "bookthief", "bookthief")
    thief.envoy.wait_ready()
    assert thief.get(BOOKSTORE, "/books-bought").status_code == 404

    # bookthief going straight to bookstore-v1's inbound with its own workload certificate
    # (a mesh certificate of its account, and its key): RBAC 403
    issued, key_pem = mesh.proxy_certificate("bookthief", "bookthief", "bookthief")
    files = mesh.write_files("thief-direct", issued, key_pem)
    context = ssl.create_default_context(cafile=str(files.trust_bundle))
    context.check_hostname = False
    context.load_cert_chain(str(files.cert_chain.parent / "workload.pem"), str(files.key))
    direct = httpx.get(
        f"https://127.0.0.1:{v1.inbound_port}/books-bought", verify=context, timeout=5
    )
    assert direct.status_code == 403
    # and without a client certificate the handshake itself fails
    bare = ssl.create_default_context(cafile=str(files.trust_bundle))
    bare.check_hostname = False
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"https://127.0.0.1:{v1.inbound_port}/books-bought", verify=bare, timeout=5)

    # mTLS between sidecars, from Envoy's own statistics
    assert buyer.envoy.stat("cluster.bookstore/bookstore-v1|14001.ssl.handshake") > 0
    assert v1.envoy.stat(f"listener.0.0.0.0_{v1.inbound_port}.ssl.handshake") > 0
    assert v1.envoy.stat("http.inbound.rbac.allowed") > 0
    assert v1.envoy.stat("http.inbound.rbac.denied") > 0

    # proxy-cp's view of its proxies: versions ACKed, both protocols
    proxies = {p["proxy"]: p for p in mesh.proxies()}
    assert proxies[buyer.common_name]["protocol"] == "delta"
    assert proxies[v1.common_name]["protocol"] == "sotw"
    assert proxies[v1.common_name]["envoy_version"].startswith("1.40")
    # bookstore-v1 calls nobody: it has no EDS; bookbuyer has every type
    assert set(proxies[v1.common_name]["types"]) == {"cds", "lds", "rds", "sds"}
    assert set(proxies[buyer.common_name]["types"]) == {"cds", "eds", "lds", "rds", "sds"}
    for proxy in (v1, buyer):
        for kind, state in proxies[proxy.common_name]["types"].items():
            assert state["acked_version"] == state["sent_version"], (kind, state)
            assert state["nacks"] == 0
    config = (
        mesh.proxy_cp_of(v1.common_name).get(f"/v1/proxies/{v1.common_name}/config?type=sds").json()
    )
    assert "PRIVATE KEY" not in json.dumps(config)
    assert "[redacted]" in json.dumps(config)


def test_a_service_certificate_rotation_reaches_no_proxy_and_drops_no_request(
    mesh: Mesh,
) -> None:
    """Each proxy serves its own workload certificate (its files, its key); the service's
    certificate, rotated, is not sent to any proxy, and traffic is untouched."""
    v1, _, buyer = bookstore(mesh)
    own = x509.load_pem_x509_certificate(
        (mesh.tmp / "proxies" / "bookstore-v1" / "workload.pem").read_bytes()
    )
    own_serial = f"{own.serial_number:x}"

    def served() -> str:
        return json.dumps(v1.envoy.get("/certs").json())

    assert own_serial in served()
    failures: list[str] = []
    done = threading.Event()
    answered = 0

    def load() -> None:
        nonlocal answered
        while not done.is_set():
            try:
                response = buyer.get(BOOKSTORE, "/books-bought", timeout=5)
                answered += 1
                if response.status_code != 200:
                    failures.append(str(response.status_code))
            except httpx.HTTPError as exc:
                failures.append(repr(exc))

    worker = threading.Thread(target=load)
    worker.start()
    try:
        rotated = mesh.trellis(
            "certs", "rotate", "bookstore-v1.bookstore.svc.cluster.local", "--json"
        )
        assert rotated.returncode == 0, rotated.stderr
        serial = json.loads(rotated.stdout)["certificate"]["serial"]
        after = answered
        asyncio.run(eventually(lambda: answered >= after + 50, timeout=20, message="more load"))
    finally:
        done.set()
        worker.join()
    assert failures == []
    assert own_serial in served()
    assert serial not in served()


def test_a_nacked_route_keeps_the_previous_config(mesh: Mesh) -> None:
    _, _, buyer = bookstore(mesh)
    routes = mesh.spec_dir / "access.yaml"
    # RE2 has no \\Z: Python accepts the pattern, Envoy rejects the route configuration
    routes.write_text(
        routes.read_text().replace("pathRegex: /books-bought", "pathRegex: '/books-bought\\Z'")
    )

    def nacked() -> bool:
        return any(
            p["types"].get("lds", {}).get("nacks", 0) + p["types"].get("rds", {}).get("nacks", 0)
            for p in mesh.proxies()
        )

    asyncio.run(eventually(nacked, timeout=20, interval=0.3, message="a NACK is recorded"))
    assert buyer.get(BOOKSTORE, "/books-bought").status_code == 200


@dataclass
class _Info:
    common_name: str


@dataclass
class ForeignCertificate:
    """A certificate an impostor presents as its proxy's (the shape of the harness's
    ``IssueCertificate`` answer)."""

    info: _Info
    cert_chain_pem: bytes
    private_key_pem: bytes
    trust_bundle_pem: bytes
    workload_cert_chain_pem: bytes = b""  # the CA issued it none


def foreign_certificate(common_name: str, mesh_trust_bundle: bytes) -> ForeignCertificate:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Not The Mesh CA")])
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())
    )
    return ForeignCertificate(
        _Info(common_name),
        cert.public_bytes(serialization.Encoding.PEM),
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        mesh_trust_bundle,
    )


def admin_up(sidecar: Sidecar) -> Any:
    def up() -> bool:
        try:
            return sidecar.envoy.get("/server_info").status_code == 200
        except httpx.HTTPError:
            return False

    return up


def test_proxies_the_mesh_did_not_onboard_are_refused(mesh: Mesh) -> None:
    # a mesh certificate that is not a proxy certificate: a proxy's own workload
    # certificate (what its host holds besides the proxy certificate), with its key
    proxy_cert, key_pem = mesh.proxy_certificate("bookthief", "bookthief", "bookthief")
    workload = x509.load_pem_x509_certificate(proxy_cert.workload_cert_chain_pem)
    workload_cn = workload.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    presented = ForeignCertificate(
        _Info(str(workload_cn)),
        proxy_cert.workload_cert_chain_pem,
        key_pem,
        proxy_cert.trust_bundle_pem,
        proxy_cert.workload_cert_chain_pem,
    )
    impostor = mesh.onboard(
        "impostor", "bookthief", "bookthief", "bookthief", issued=(presented, key_pem)
    )

    def refused_logged() -> bool:
        return any(
            "ads.refused" in line and impostor.common_name in line and "PERMISSION_DENIED" in line
            for line in mesh.processes["proxy-cp"].logs().splitlines()
        )

    asyncio.run(eventually(refused_logged, timeout=20, interval=0.3, message="refusal logged"))
    asyncio.run(eventually(admin_up(impostor), timeout=10, message="impostor admin API up"))
    # Envoy counts each retried stream as connected from its start until the refusal comes
    # back: read the state until it is seen down, and check that no configuration ever came
    asyncio.run(
        eventually(
            lambda: impostor.envoy.stat("control_plane.connected_state") == 0,
            timeout=10,
            interval=0.05,
            message="impostor not connected",
        )
    )
    cds = impostor.envoy.stats("cluster_manager.cds.")
    assert cds["cluster_manager.cds.update_success"] == 0, cds
    assert not any(p["proxy"] == impostor.common_name for p in mesh.proxies())

    # a proxy certificate from a foreign CA never gets past the TLS handshake
    root = mesh.certmanager("GetRoot", cm.GetRootRequest())
    foreign = foreign_certificate(
        "0b0e4a6e-1a2b-4c3d-8e9f-00000000abcd.bookbuyer.bookbuyer", root.trust_bundle_pem
    )
    sidecar = mesh.onboard(
        "foreign",
        "bookbuyer",
        "bookbuyer",
        "bookbuyer",
        issued=(foreign, foreign.private_key_pem),
    )

    def failing() -> bool:
        try:
            seen = sidecar.envoy.stats("cluster.trellis-xds.")
        except httpx.HTTPError:
            return False  # still starting
        return (
            seen.get("cluster.trellis-xds.ssl.connection_error", 0)
            + seen.get("cluster.trellis-xds.upstream_cx_destroy", 0)
            + seen.get("cluster.trellis-xds.upstream_cx_connect_fail", 0)
            > 0
        )

    asyncio.run(eventually(failing, timeout=20, interval=0.3, message="foreign proxy fails TLS"))
    # as for the impostor: a retried stream counts as connected from its start until its
    # handshake fails, so the state is read until it is seen down; no configuration came
    asyncio.run(
        eventually(
            lambda: sidecar.envoy.stat("control_plane.connected_state") == 0,
            timeout=10,
            interval=0.05,
            message="foreign proxy not connected",
        )
    )
    assert sidecar.envoy.stats("cluster_manager.cds.")["cluster_manager.cds.update_success"] == 0
    assert not any(p["proxy"] == sidecar.common_name for p in mesh.proxies())


def test_egress_follows_meshconfig(mesh: Mesh) -> None:
    _, _, buyer = bookstore(mesh)
    outside = mesh.app("outside")  # not in the mesh: no sidecar, no registration
    host = f"127.0.0.1:{outside.port}"
    assert buyer.get(host, "/anything").status_code == 404  # egress off: denied

    config = mesh.spec_dir / "meshconfig.yaml"
    config.write_text(config.read_text().replace("enableEgress: false", "enableEgress: true"))

    def reached() -> bool:
        try:
            response = buyer.get(host, "/anything", timeout=2)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and response.json()["app"] == "outside"

    asyncio.run(eventually(reached, timeout=20, interval=0.3, message="egress reaches outside"))
    # mesh destinations still win over the catch-all
    assert buyer.get(BOOKSTORE, "/books-bought").json()["app"] in ("v1", "v2")
