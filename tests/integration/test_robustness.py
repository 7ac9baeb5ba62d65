"""Robustness with real processes: a bad record or a lost peer never breaks the mesh.

Each test reproduces a failure seen in a real run and shows it fixed end to end.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from trellis_common.testing import RedisServer
from trellis_common.testing.mesh import Mesh, bookstore

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

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
    url = mesh.processes[service].endpoint.admin_url + path
    return httpx.get(url, timeout=5).json()


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
        "certmanager watch",
        "recompute",
    }
