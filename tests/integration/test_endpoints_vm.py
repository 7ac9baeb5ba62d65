"""endpoints-vm as a process: REST/CLI registration, expiry, spec directory, its signals on
the one event path, persistence, Redis outages (paused, wiped) and corrupt records in Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc
from trellis_identity import tokens
from trellis_runtime.registry import ServiceRecord, discover
from trellis_testing import RedisServer, eventually
from trellis_testing.services import ServiceProcess, trellis

pytestmark = pytest.mark.integration

SERVICE_ENTRY = """
apiVersion: networking.istio.io/v1beta1
kind: ServiceEntry
metadata: {name: payments, namespace: shop}
spec:
  hosts: [payments.example.com]
  ports:
  - {number: 443, name: https, protocol: HTTPS}
  location: MESH_EXTERNAL
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: shop}
spec:
  hosts: [db.shop.svc.cluster.local]
  ports:
  - {number: 5432, name: tcp-pg, protocol: TCP}
  location: MESH_INTERNAL
  resolution: STATIC
  workloadSelector:
    labels: {app: db}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: db-1, namespace: shop}
spec:
  address: 10.9.0.1
  labels: {app: db}
  serviceAccount: db
"""


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    path = tmp_path / "spec"
    path.mkdir()
    return path


@pytest.fixture
def endpoints_vm(
    state_dir: Path, redis_server: RedisServer, spec_dir: Path, certmanager: ServiceProcess
) -> Iterator[ServiceProcess]:
    """endpoints-vm, with the certmanager it joins the mesh through."""
    process = ServiceProcess(
        "endpoints-vm",
        "trellis_endpoints_vm.main",
        state_dir,
        redis_server,
        args=("--spec-dir", str(spec_dir)),
        env={
            "TRELLIS_ENDPOINTS_VM_SPEC_POLL_INTERVAL": "0.1",
            "TRELLIS_ENDPOINTS_VM_EXPIRY_INTERVAL": "0.1",
            "TRELLIS_ENDPOINTS_VM_STORE_TIMEOUT": "1",
            "TRELLIS_ENDPOINTS_VM_STORE_CHECK_INTERVAL": "0.2",
        },
    )
    process.start()
    try:
        yield process
    finally:
        process.stop()


def services(process: ServiceProcess) -> dict[str, Any]:
    body = process.get("/v1/services").json()
    return {f"{s['namespace']}/{s['name']}": s for s in body["services"]}


def addresses(process: ServiceProcess, key: str) -> list[str]:
    return [e["address"] for e in services(process).get(key, {}).get("endpoints", [])]


async def test_cli_registration_expiry_and_heartbeat(
    endpoints_vm: ServiceProcess, state_dir: Path
) -> None:
    done = await asyncio.to_thread(
        trellis,
        state_dir,
        "vm",
        "register",
        "-n",
        "shop",
        "--name",
        "cart-1",
        "--service",
        "cart",
        "--service",
        "cart-v1",
        "--address",
        "10.1.0.1",
        "--port",
        "http=8080",
        "--port",
        "metrics=9090",
        "--ttl",
        "3",  # long enough to read the endpoints back after the CLI returns, under load
        "--label",
        "app=cart",
        "--service-account",
        "cart",
        "--locality",
        "eu/west-1",
    )
    assert done.returncode == 0, done.stderr
    assert addresses(endpoints_vm, "shop/cart") == ["10.1.0.1"]
    assert addresses(endpoints_vm, "shop/cart-v1") == ["10.1.0.1"]
    endpoint = services(endpoints_vm)["shop/cart"]["endpoints"][0]
    assert endpoint["ports"] == {"http": 8080, "metrics": 9090}
    assert endpoint["service_account"] == "cart"

    # no heartbeat for longer than the TTL: taken out of both services, registration kept
    await eventually(lambda: addresses(endpoints_vm, "shop/cart") == [], timeout=8)
    assert addresses(endpoints_vm, "shop/cart-v1") == []
    listed = await asyncio.to_thread(trellis, state_dir, "vm", "list", "--json")
    workload = json.loads(listed.stdout)["workloads"][0]
    assert workload["alive"] is False
    table = await asyncio.to_thread(trellis, state_dir, "vm", "list")
    assert "EXPIRED" in table.stdout

    beat = await asyncio.to_thread(
        trellis, state_dir, "vm", "heartbeat", "-n", "shop", "--name", "cart-1"
    )
    assert beat.returncode == 0, beat.stderr
    assert addresses(endpoints_vm, "shop/cart") == ["10.1.0.1"]

    bad = await asyncio.to_thread(
        trellis,
        state_dir,
        "vm",
        "register",
        "-n",
        "shop",
        "--name",
        "x",
        "--service",
        "s",
        "--address",
        "10.1.0.9",
        "--port",
        "http=99999",
    )
    assert bad.returncode == 2  # refused as malformed: a usage error
    assert "ports[http]" in bad.stderr
    gone = await asyncio.to_thread(
        trellis, state_dir, "vm", "deregister", "-n", "shop", "--name", "cart-1"
    )
    assert gone.returncode == 0
    assert "shop/cart" not in services(endpoints_vm)


async def test_spec_directory_is_watched_and_a_broken_file_keeps_the_last_good_version(
    endpoints_vm: ServiceProcess, spec_dir: Path
) -> None:
    path = spec_dir / "shop.yaml"
    path.write_text(SERVICE_ENTRY)
    await eventually(lambda: "shop/payments.example.com" in services(endpoints_vm), timeout=5)
    assert addresses(endpoints_vm, "shop/payments.example.com") == ["payments.example.com"]
    assert addresses(endpoints_vm, "shop/db.shop.svc.cluster.local") == ["10.9.0.1"]

    # an edit (new address for the WorkloadEntry) is picked up
    path.write_text(SERVICE_ENTRY.replace("10.9.0.1", "10.9.0.2"))
    await eventually(
        lambda: addresses(endpoints_vm, "shop/db.shop.svc.cluster.local") == ["10.9.0.2"],
        timeout=5,
    )
    # a half-written file: nothing is lost, the error names the file
    path.write_text(SERVICE_ENTRY.replace("10.9.0.1", "10.9.0.3")[:300] + "\n  ports: [")

    def reported() -> bool:
        body = endpoints_vm.get("/v1/documents").json()
        return any(d["status"] == "error" for d in body["documents"])

    await eventually(reported, timeout=5)
    assert addresses(endpoints_vm, "shop/db.shop.svc.cluster.local") == ["10.9.0.2"]
    documents = endpoints_vm.get("/v1/documents").json()
    error = next(d for d in documents["documents"] if d["status"] == "error")
    assert error["source"].endswith("shop.yaml")
    assert "line" in error["reason"]

    # an invalid document (port out of range) keeps its previous version too
    path.write_text(SERVICE_ENTRY.replace("number: 5432", "number: 99999"))
    await eventually(reported, timeout=5)
    assert "shop/db.shop.svc.cluster.local" in services(endpoints_vm)

    path.unlink()
    await eventually(lambda: services(endpoints_vm) == {}, timeout=5)


async def test_the_catalog_s_watch_hears_each_change_from_the_provider_in_the_registry(
    endpoints_vm: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    """The contract the catalog follows a provider by: found in the registry (kind
    ``endpoints-provider``), watched over mTLS as the catalog (``WatchServices``): every
    service first, then each change, a service gone as ``removed``."""
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:

        async def provider() -> ServiceRecord | None:
            found = await discover(client, "endpoints-provider")
            return found[0] if len(found) == 1 else None

        record = await eventually(provider, timeout=10, message="endpoints-vm in the registry")
        assert record is not None
        assert record.grpc_address == endpoints_vm.endpoint.grpc_address
        async with (
            admin(endpoints_vm, state_dir) as http,
            endpoints_vm.channel("catalog") as channel,
        ):
            watch = pb_grpc.EndpointsProviderStub(channel).WatchServices(pb.ListServicesRequest())

            async def answer() -> pb.ServiceChanges:
                found = await asyncio.wait_for(watch.read(), 10)
                assert isinstance(found, pb.ServiceChanges), found
                return found

            try:
                first = await answer()
                assert first.full
                assert "web" not in {s.info.service.name for s in first.services}
                created = await http.post("/v1/workloads", json=registration("web-1", "10.4.0.1"))
                assert created.status_code == 201, created.text
                changed = await answer()
                assert [
                    (s.info.service.namespace, s.info.service.name) for s in changed.services
                ] == [("shop", "web")]
                assert [e.address for e in changed.services[0].endpoints] == ["10.4.0.1"]

                assert (await http.delete("/v1/workloads/shop/web-1")).status_code == 204
                gone = await answer()
                assert [(r.namespace, r.name) for r in gone.removed] == [("shop", "web")]
            finally:
                watch.cancel()
    finally:
        await client.aclose()


async def test_registrations_survive_crashes_and_redis_restarts(
    endpoints_vm: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    for i in range(3):
        done = await asyncio.to_thread(
            trellis,
            state_dir,
            "vm",
            "register",
            "-n",
            "shop",
            "--name",
            f"web-{i}",
            "--service",
            "web",
            "--address",
            f"10.2.0.{i + 1}",
            "--port",
            "8080",
        )
        assert done.returncode == 0, done.stderr
    expected = ["10.2.0.1", "10.2.0.2", "10.2.0.3"]
    endpoints_vm.kill()
    endpoints_vm.start()
    assert addresses(endpoints_vm, "shop/web") == expected

    redis_server.kill()
    redis_server.start()
    endpoints_vm.kill()
    endpoints_vm.start()
    assert addresses(endpoints_vm, "shop/web") == expected

    # and it keeps accepting registrations after Redis came back under it
    redis_server.kill()
    redis_server.start()

    async def registers() -> bool:
        done = await asyncio.to_thread(
            trellis,
            state_dir,
            "vm",
            "register",
            "-n",
            "shop",
            "--name",
            "web-9",
            "--service",
            "web",
            "--address",
            "10.2.0.9",
            "--port",
            "8080",
        )
        return done.returncode == 0

    await eventually(registers, timeout=15, interval=0.5)
    endpoints_vm.stop()
    endpoints_vm.start()
    assert addresses(endpoints_vm, "shop/web") == [*expected, "10.2.0.9"]


# --- Redis outages and corrupt records ------------------------------------------------------

WORKLOADS_KEY = "trellis:endpoints-vm:workloads"
HEARTBEATS_KEY = "trellis:endpoints-vm:heartbeats"


def registration(name: str, address: str, ttl: float | None = None) -> dict[str, Any]:
    return {
        "namespace": "shop",
        "name": name,
        "services": ["web"],
        "address": address,
        "ports": [{"name": "", "number": 8080}],
        "ttl": ttl,
    }


def admin(process: ServiceProcess, state_dir: Path) -> httpx.AsyncClient:
    token = tokens.load_or_create_admin_token(state_dir)
    return process.async_client(headers={"Authorization": f"Bearer {token}"}, timeout=30)


def stored(redis_server: RedisServer) -> dict[str, dict[str, Any]]:
    with redis.Redis.from_url(redis_server.url) as client:
        raw = client.hgetall(WORKLOADS_KEY)
    return {field.decode(): json.loads(value) for field, value in raw.items()}


async def timed(call: Any) -> tuple[httpx.Response, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await call
    return response, loop.time() - started


async def test_a_frozen_redis_neither_hangs_calls_nor_expires_workloads_that_beat(
    endpoints_vm: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    ttl = 2.0
    async with admin(endpoints_vm, state_dir) as client:
        created = await client.post("/v1/workloads", json=registration("web-1", "10.3.0.1", ttl))
        assert created.status_code == 201, created.text
        own = {"Authorization": f"Bearer {created.json()['heartbeat_token']}"}
        loop = asyncio.get_running_loop()
        redis_server.pause()
        try:
            paused_at = loop.time()
            beats = 0
            # The workload's agent keeps its cadence through a pause of more than twice the TTL.
            while loop.time() - paused_at < 2.5 * ttl:
                beat, took = await timed(
                    client.post("/v1/workloads/shop/web-1/heartbeat", headers=own)
                )
                assert beat.status_code == 200, beat.text
                assert took < 3.0, f"a heartbeat took {took:.1f}s on a frozen Redis"
                beats += 1
                assert addresses(endpoints_vm, "shop/web") == ["10.3.0.1"]
                await asyncio.sleep(0.4)  # the agent's heartbeat interval
            assert beat.json()["persisted"] is False
            assert beats >= 5

            refused, took = await timed(
                client.post("/v1/workloads", json=registration("web-2", "10.3.0.2"))
            )
            assert refused.status_code == 503
            assert "Redis is unavailable" in refused.json()["detail"]
            assert took < 3.0
            status = (await client.get("/v1/status")).json()
            store_loop = next(loop for loop in status["loops"] if loop["name"] == "workload-store")
            assert store_loop["up"] is False
            assert "redis unavailable" in store_loop["reason"]
        finally:
            redis_server.resume()

        last_beat = float(beat.json()["expires_at"]) - ttl

        def flushed() -> bool:  # heartbeats have a hash of their own (replicas write them)
            with redis.Redis.from_url(redis_server.url) as client:
                beat = client.hget(HEARTBEATS_KEY, "shop/web-1")
            return beat is not None and float(beat) == last_beat

        await eventually(flushed, timeout=10, message="queued heartbeat written to Redis")

        async def store_up() -> bool:
            loops = (await client.get("/v1/status")).json()["loops"]
            return any(loop["name"] == "workload-store" and loop["up"] for loop in loops)

        await eventually(store_up, timeout=10)
    # the agent stops: the workload expires after its grace, it is not held forever
    await eventually(lambda: addresses(endpoints_vm, "shop/web") == [], timeout=10)


async def test_a_wiped_redis_gets_every_registration_back(
    endpoints_vm: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    async with admin(endpoints_vm, state_dir) as client:
        for i in range(3):
            created = await client.post(
                "/v1/workloads", json=registration(f"web-{i}", f"10.4.0.{i + 1}")
            )
            assert created.status_code == 201, created.text
    before = stored(redis_server)
    assert len(before) == 3
    redis_server.kill()
    redis_server.wipe()
    redis_server.start()
    assert stored(redis_server) == {}
    await eventually(lambda: stored(redis_server) == before, timeout=15)
    # the log line follows the writes (the keys can be seen before it is written)
    await eventually(lambda: "workloads.store_restored count=3" in endpoints_vm.logs(), timeout=5)
    endpoints_vm.kill()
    endpoints_vm.start()
    assert addresses(endpoints_vm, "shop/web") == ["10.4.0.1", "10.4.0.2", "10.4.0.3"]


async def test_corrupt_records_in_redis_are_skipped_reported_and_removable(
    endpoints_vm: ServiceProcess, redis_server: RedisServer, state_dir: Path
) -> None:
    async with admin(endpoints_vm, state_dir) as client:
        created = await client.post("/v1/workloads", json=registration("good", "10.5.0.1"))
        assert created.status_code == 201, created.text
    good = stored(redis_server)["shop/good"]
    endpoints_vm.stop()
    with redis.Redis.from_url(redis_server.url) as raw:
        raw.hset(
            WORKLOADS_KEY,
            mapping={
                "shop/truncated": json.dumps({**good, "name": "truncated"})[:50],
                "shop/badport": json.dumps({**good, "name": "badport", "ports": [["", 0]]}),
            },
        )
    endpoints_vm.start()

    assert addresses(endpoints_vm, "shop/web") == ["10.5.0.1"]
    async with admin(endpoints_vm, state_dir) as client:
        status = (await client.get("/v1/status")).json()
        reasons = {r["key"]: r["reason"] for r in status["rejections"] if r["source"] == "redis"}
        assert sorted(reasons) == [
            f"{WORKLOADS_KEY}[shop/badport]",
            f"{WORKLOADS_KEY}[shop/truncated]",
        ]
        assert reasons[f"{WORKLOADS_KEY}[shop/truncated]"].startswith("malformed workload record")
        assert "ports" in reasons[f"{WORKLOADS_KEY}[shop/badport]"]
        metrics = (await client.get("/metrics")).text
        assert 'trellis_rejected_records_total{source="redis"} 2.0' in metrics
        assert [w["name"] for w in (await client.get("/v1/workloads")).json()["workloads"]] == [
            "good"
        ]

        # the operator removes one, the workload of the other registers again
        assert (await client.delete("/v1/workloads/shop/truncated")).status_code == 204
        again = await client.post("/v1/workloads", json=registration("badport", "10.5.0.2"))
        assert again.status_code == 201, again.text
        assert (await client.get("/v1/status")).json()["rejections"] == []
    assert sorted(stored(redis_server)) == ["shop/badport", "shop/good"]
