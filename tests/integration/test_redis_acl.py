"""Redis with users, in a running mesh: every service is its own ACL user, and what Redis
refuses is logged and counted (by the catalog's Redis audit).

The negative tests each check the refusal itself and that it shows where an operator looks:
a ``redis.refused`` / ``redis.acl_denied`` line in the catalog's log and a count in its
``/metrics``. The last test runs the bookstore through real Envoy sidecars, then greps
everything the mesh wrote (every Redis value, every file of the state directory and of
Redis's own directory, the CLI's output) for a private key and for the Redis passwords.

The services (and their Redis, state directory and spec directory) start once for the
module, and its tests share them: a test reads each count before its action and asserts
the change, looks for log lines only past where the log stood before, and after each test
its sidecars, apps and workloads are gone and no Redis client of a test is left connected
(:class:`Baseline`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from trellis_runtime import redisacl
from trellis_testing import RedisServer, eventually
from trellis_testing.baseline import BOOKSTORE_WORKLOADS, Baseline, module_mesh
from trellis_testing.mesh import Mesh, bookstore

# one mesh for the module (its fixtures): its tests run on one xdist worker
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("redis-acl-mesh")]
MESH_NAME = "redis-acl"

ROOT = Path(__file__).resolve().parents[2]


class AclBaseline(Baseline):
    """The baseline, and no Redis client connected as a user the services and the operator
    were not."""

    def __init__(self, mesh: Mesh) -> None:
        super().__init__(mesh, registered=BOOKSTORE_WORKLOADS)
        self.redis_users = client_users(mesh)

    def answers(self) -> dict[str, Any]:
        users = client_users(self.mesh)
        known = getattr(self, "redis_users", users)  # the baseline's own first reading
        return {**super().answers(), "foreign Redis users": sorted(users - known)}


shared, mesh = module_mesh(MESH_NAME, ROOT / "examples" / "bookstore", Mesh, AclBaseline)


def metric(mesh: Mesh, name: str, **labels: str) -> float:
    """A sample of the catalog's ``/metrics`` (0 if absent)."""
    text = mesh.processes["catalog"].get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def catalog_log(mesh: Mesh) -> str:
    return mesh.processes["catalog"].logs()


def server(mesh: Mesh) -> RedisServer:
    """The mesh's one Redis (this file's mesh has no Sentinel)."""
    assert isinstance(mesh.redis, RedisServer)
    return mesh.redis


def as_user(server: RedisServer, user: str) -> redis.Redis:
    return redis.Redis(port=server.port, username=user, password=server.password(user))


async def audit_started(mesh: Mesh) -> None:
    await eventually(lambda: "redis.audit_started" in catalog_log(mesh), timeout=15)


def client_users(mesh: Mesh) -> set[str]:
    """The users of the clients connected to the mesh's Redis (this one's, admin, too)."""
    with as_user(server(mesh), "admin") as admin:
        return {client["user"] for client in admin.client_list()}


def test_every_service_is_logged_in_as_its_own_user(mesh: Mesh) -> None:
    users = client_users(mesh)
    assert users == {"admin", *mesh.processes}, "no service is default or admin"


async def test_a_connection_without_a_password_is_refused_logged_and_counted(
    mesh: Mesh,
) -> None:
    await audit_started(mesh)
    before = metric(mesh, "trellis_redis_refusals_total", error="NOAUTH")
    logged = len(catalog_log(mesh))  # the shared mesh's log: this test's lines come after
    with (
        redis.Redis(port=server(mesh).port, protocol=2) as stranger,
        pytest.raises(redis.AuthenticationError, match="Authentication required"),
    ):
        stranger.get("trellis:certmanager:ca")

    await eventually(
        lambda: metric(mesh, "trellis_redis_refusals_total", error="NOAUTH") >= before + 1,
        timeout=15,
    )
    assert "redis.refused error=NOAUTH count=1" in catalog_log(mesh)[logged:]


async def test_a_component_touching_anothers_keys_or_channels_is_refused_logged_and_counted(
    mesh: Mesh,
) -> None:
    await audit_started(mesh)
    # the shared mesh's counts and log: this test asserts what its denials add to them
    keys, channels, refusals = denials(mesh)
    logged = len(catalog_log(mesh))
    with as_user(server(mesh), "proxy-cp") as proxy_cp:
        with pytest.raises(redis.exceptions.NoPermissionError):
            proxy_cp.get("trellis:certmanager:ca")  # read the CA
        with pytest.raises(redis.exceptions.NoPermissionError):
            proxy_cp.set("trellis:endpoints-vm:workloads", "{}")  # overwrite the VMs
        with pytest.raises(redis.exceptions.NoPermissionError):
            proxy_cp.publish("trellis:events:certificates", "{}")  # ring certmanager's bell

    def counted() -> bool:
        # one audit poll reads INFO errorstats, then ACL LOG: a denial made between the two
        # reads is in the log's figures at once and in errorstats' at the next poll
        now_keys, now_channels, now_refusals = denials(mesh)
        return (
            now_keys == keys + 2 and now_channels == channels + 1 and now_refusals >= refusals + 3
        )

    await eventually(counted, timeout=15)
    assert denials(mesh)[2] >= refusals + 3
    log = catalog_log(mesh)[logged:]
    for what in ("trellis:certmanager:ca", "trellis:endpoints-vm:workloads"):
        assert f"redis.acl_denied user=proxy-cp reason=key object={what} " in log
    assert "redis.acl_denied user=proxy-cp reason=channel object=trellis:events:certificates" in (
        log
    )


def denials(mesh: Mesh) -> tuple[float, float, float]:
    """proxy-cp's key and channel denials, and the NOPERM refusals, as the catalog counts."""
    return (
        metric(mesh, "trellis_redis_acl_denied_total", user="proxy-cp", reason="key"),
        metric(mesh, "trellis_redis_acl_denied_total", user="proxy-cp", reason="channel"),
        metric(mesh, "trellis_redis_refusals_total", error="NOPERM"),
    )


PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----")


def redis_values(server: RedisServer) -> list[bytes]:
    values: list[bytes] = []
    with as_user(server, "admin") as admin:
        for key in admin.scan_iter(count=500):
            kind = admin.type(key)
            if kind == b"string":
                values.append(admin.get(key) or b"")
            elif kind == b"hash":
                values += admin.hgetall(key).values()
            else:
                values += [repr(admin.dump(key)).encode()]
    return values


def test_no_private_key_or_redis_password_in_anything_the_mesh_wrote(
    mesh: Mesh, tmp_path: Path
) -> None:
    bookstore(mesh)  # proxies onboarded, keys issued and served over SDS, traffic flowing
    outputs = {f"redis value {i}": v for i, v in enumerate(redis_values(server(mesh)))}
    assert len(outputs) >= 3, "the CA and the certificate records are in Redis"
    users = server(mesh).users_dir
    for folder in (mesh.state_dir, server(mesh).dir):
        for path in folder.rglob("*"):
            if path.is_file():
                outputs[str(path)] = path.read_bytes()
    for command in (("status", "--json"), ("certs", "list", "--json"), ("proxy", "list")):
        done = mesh.trellis(*command)
        outputs[" ".join(command)] = (done.stdout + done.stderr).encode()

    assert [where for where, data in outputs.items() if PRIVATE_KEY.search(data)] == []
    for user in ("admin", *redisacl.COMPONENTS):
        password = server(mesh).password(user).encode()
        leaks = [w for w, data in outputs.items() if password in data and w != str(users / user)]
        assert leaks == [], f"{user}'s Redis password is in {leaks}"
