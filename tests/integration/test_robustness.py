"""Robustness with real processes: a bad record or a lost peer never breaks the mesh.

Each test reproduces a failure seen in a real run and shows it fixed end to end.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from trellis_api import certmanager_pb2 as cm
from trellis_identity.identity import csr_for, new_key
from trellis_testing import RedisServer
from trellis_testing.mesh import Mesh, bookstore

PROXY_CSR = csr_for(new_key()[1], "a proxy")  # a proxy made its key; certmanager signs it

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
RECORDS = "trellis:certmanager:certs"

# The README's example ("Declaring external services and VMs"), exactly.
README_SERVICE_ENTRY = """\
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.example.com]
  ports: [{number: 443, name: https, protocol: HTTPS}]
  location: MESH_EXTERNAL
  resolution: DNS          # the host itself is the endpoint, resolved by the proxy
"""


def admin(mesh: Mesh, service: str, path: str) -> Any:
    return mesh.processes[service].get(path).json()


@pytest.fixture
def mesh(tmp_path: Path, state_dir: Path, redis_server: RedisServer) -> Iterator[Mesh]:
    spec_dir = tmp_path / "spec"
    shutil.copytree(ROOT / "examples" / "bookstore", spec_dir)
    (spec_dir / "payments.yaml").write_text(README_SERVICE_ENTRY)
    mesh = Mesh(tmp_path, state_dir, redis_server, spec_dir, vm_spec_dir=True)
    mesh.start()
    try:
        yield mesh
    finally:
        mesh.stop()


def test_readme_service_entry_then_a_vm_registration_reaches_a_real_envoy(mesh: Mesh) -> None:
    """Live failure: with the README's ServiceEntry in the spec directory, the catalog's
    follower of endpoints-vm died on the host ``payments.example.com``, so VMs registered
    afterwards never reached the catalog, and nothing said so."""
    # bookstore() registers the bookstore VMs after the ServiceEntry is in force, then
    # waits until bookbuyer's real Envoy reaches them through the mesh.
    _v1, _v2, buyer = bookstore(mesh)
    assert buyer.get("bookstore.bookstore:14001", "/books-bought").status_code == 200

    services = {
        f"{s['namespace']}/{s['name']}": s
        for s in admin(mesh, "catalog", "/v1/services")["services"]
    }
    assert services["shop/payments"]["hosts"] == ["payments.example.com"]
    assert {"bookstore/bookstore-v1", "bookstore/bookstore-v2"} <= set(services)
    status = admin(mesh, "catalog", "/v1/status")
    assert status["rejections"] == []
    assert all(loop["up"] for loop in status["loops"]), status["loops"]
    assert {loop["name"] for loop in status["loops"]} >= {
        "provider endpoints-vm",
        "endpoints providers",
        "certmanager",
        "signals",
        "recompute",
    }


def test_a_bad_account_stored_by_an_older_certmanager_no_longer_crash_loops_the_catalog(
    mesh: Mesh, redis_server: RedisServer
) -> None:
    """Live failure: an ``IssueCertificate`` of kind PROXY for service account ``Bad Name!``
    was accepted and stored durably, and made the catalog's flush raise at every start:
    /readyz never came back and no API could delete the record."""
    # today, certmanager refuses it where it enters, naming the field
    with pytest.raises(grpc.RpcError) as refused:
        mesh.certmanager("IssueCertificate", proxy_request("Bad Name!"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "service_account" in (refused.value.details() or "")

    # an older certmanager stored one anyway: plant it as it would have been stored
    issued = mesh.certmanager("IssueCertificate", proxy_request("bookbuyer"))
    common_name = issued.info.common_name
    with redis.Redis.from_url(redis_server.url) as raw:
        stored = json.loads(raw.hget(RECORDS, common_name) or b"")
        raw.hset(RECORDS, common_name, json.dumps({**stored, "service_account": "Bad Name!"}))
    for name in ("certmanager", "catalog"):  # both restart and read it
        mesh.processes[name].kill()
        mesh.processes[name].restart()  # waits for /readyz: it used to never come back

    rejected = {
        r["key"]: r["reason"] for r in admin(mesh, "certmanager", "/v1/status")["rejections"]
    }
    assert "service account 'Bad Name!'" in rejected[f"{RECORDS}[{common_name}]"]
    # proxy-cp's and the catalog's streams to certmanager reconnect (with backoff): until
    # then, status says so and exits 1; then it is healthy, rejected record and all
    deadline = time.monotonic() + 30
    while (status := mesh.trellis("status", "--json")).returncode != 0:
        assert time.monotonic() < deadline, status.stdout + status.stderr
        time.sleep(0.2)
    services = {s["service"]: s for s in json.loads(status.stdout)["services"]}
    assert [r["key"] for r in services["certmanager"]["rejections"]] == [
        f"{RECORDS}[{common_name}]"
    ]
    table = mesh.trellis("status")
    assert "Rejected records" in table.stdout, table.stdout
    assert "Bad Name!" in table.stdout, table.stdout

    # the operator removes it (re-issuing the name would overwrite it too)
    token = (mesh.state_dir / "admin-token").read_text().strip()
    deleted = mesh.processes["certmanager"].delete(
        f"/v1/certificates/{common_name}", headers={"authorization": f"Bearer {token}"}
    )
    assert deleted.status_code == 204, deleted.text
    assert admin(mesh, "certmanager", "/v1/status")["rejections"] == []


def proxy_request(account: str) -> cm.IssueCertificateRequest:
    return cm.IssueCertificateRequest(
        kind=cm.CERTIFICATE_KIND_PROXY,
        service=cm.MeshService(namespace="bookbuyer", name="bookbuyer"),
        service_account=account,
        csr_pem=PROXY_CSR,
    )
