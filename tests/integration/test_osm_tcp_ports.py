"""TCP services on one port, against real Envoy: the TrafficSplit root takes the port.

A client of TCP services tells them apart by port alone (no Host header), so two TCP
services of one port cannot both have a listener at the client. Here ``db-v1`` and the
split root ``store-db`` (whose only backend is ``db-v2``) share a port; ``db-v1`` comes
first by name, which used to decide. The root must win, whatever the names, and the
conflict shows in ``trellis policy check`` and in db-v1's status.
"""

from __future__ import annotations

import asyncio
import socket

import pytest

from trellis_testing import eventually
from trellis_testing.apps import TcpApp
from trellis_testing.mesh import Mesh, bookstore
from trellis_testing.ports import free_port

pytestmark = pytest.mark.integration


def documents(port: int) -> str:
    services = "\n---\n".join(
        f"""apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: bookstore}}
spec: {{ports: [{{name: tcp-db, port: {port}}}]}}"""
        for name in ("db-v1", "db-v2", "store-db")
    )
    return f"""{services}
---
apiVersion: split.smi-spec.io/v1alpha2
kind: TrafficSplit
metadata: {{name: store-db-split, namespace: bookstore}}
spec:
  service: store-db
  backends:
  - {{service: db-v2, weight: 100}}
"""


def read_name(port: int) -> str:
    """Connect to the client sidecars' outbound TCP listener of ``port`` (every sidecar on
    this host has one, all permissive clients: Envoy binds with SO_REUSEPORT, so the kernel
    picks one; each applies the same precedence)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as connection:
        return connection.makefile().readline().strip()


def test_a_split_root_takes_a_shared_tcp_port_and_the_conflict_is_shown(mesh: Mesh) -> None:
    config = mesh.spec_dir / "meshconfig.yaml"
    config.write_text(
        config.read_text().replace(
            "enablePermissiveTrafficPolicyMode: false", "enablePermissiveTrafficPolicyMode: true"
        )
    )
    bookstore(mesh)
    port = free_port()
    (mesh.spec_dir / "databases.yaml").write_text(documents(port))
    apps = {}
    for name in ("db-v1", "db-v2"):
        app = apps[name] = TcpApp(name).start()
        mesh.apps.append(app)  # type: ignore[arg-type]  # stopped with the others
        sidecar = mesh.onboard(name, "bookstore", name, "db", app_port=app.port)
        sidecar.envoy.wait_ready()
        done = mesh.trellis(
            "vm", "register", "-n", "bookstore", "--name", name, "--service", name,
            "--address", "127.0.0.1", "--port", f"tcp-db={sidecar.inbound_port}",
            "--service-account", "db",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr

    def answered() -> str:
        try:
            return read_name(port)
        except OSError:
            return ""

    asyncio.run(
        eventually(
            lambda: answered() == "db-v2", timeout=30, interval=0.3, message="the root's backend"
        )
    )
    assert {read_name(port) for _ in range(10)} == {"db-v2"}
    assert apps["db-v1"].connections == 0
    assert apps["db-v2"].connections >= 10

    checked = mesh.trellis(
        "policy", "check", "--from", "bookbuyer/bookbuyer", "--to", "bookstore/db-v1"
    )
    assert checked.returncode == 0, checked.stderr
    assert "conflict TCP port" in checked.stdout
    assert "reaches bookstore/store-db on it, not bookstore/db-v1" in checked.stdout
    statuses = mesh.processes["catalog"].get("/v1/resources").json()["resources"]
    [db_v1] = [s for s in statuses if s["key"] == "Service bookstore/db-v1"]
    assert db_v1["state"] == "warning"
    assert f"TCP port {port} is also bookstore/store-db's" in db_v1["reason"]
