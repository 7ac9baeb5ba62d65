"""Leader election as a service sees it: its settings, the lock they choose, and what its
admin API says about its role (``/readyz``, ``/v1/status``, ``/metrics``).

The elections here run on a real Redis; the locks' own behaviour is in
``test_leadership_redis.py`` and ``test_leadership_kube.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from trellis_kube import leadership, leases, redislocks
from trellis_kube.leadership import Leadership, Timing
from trellis_runtime import admin
from trellis_runtime.health import Health
from trellis_runtime.settings import ServiceSettings, describe_error
from trellis_testing import RedisServer, eventually
from trellis_testing.elections import leader_and_standby
from trellis_testing.kube import KubeApi
from trellis_testing.ports import free_port

TIMING = Timing(duration=2.0, renew_deadline=1.4, retry_period=0.2)


class CertmanagerSettings(ServiceSettings):
    service_name = "certmanager"
    kubeconfig: Path | None = None


@contextlib.asynccontextmanager
async def running(*replicas: Leadership) -> AsyncIterator[None]:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(r.run(stop)) for r in replicas]
    try:
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def test_timing_is_checked() -> None:
    with pytest.raises(ValueError, match="lease_renew_deadline < lease_duration"):
        Timing(duration=10, renew_deadline=10, retry_period=2)
    with pytest.raises(ValueError, match="lease_retry_period < lease_renew_deadline"):
        Timing(duration=10, renew_deadline=3, retry_period=3)


def test_settings_refuse_a_renew_deadline_past_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRELLIS_LEASE_DURATION", "8")
    with pytest.raises(ValidationError) as refused:
        CertmanagerSettings()
    message = describe_error(CertmanagerSettings, refused.value)
    assert "TRELLIS_LEASE_RENEW_DEADLINE" in message
    assert "less than lease_duration" in message
    monkeypatch.setenv("TRELLIS_LEASE_RENEW_DEADLINE", "6")
    monkeypatch.setenv("TRELLIS_CERTMANAGER_LEASE_RETRY_PERIOD", "6")
    with pytest.raises(ValidationError) as refused:
        CertmanagerSettings()
    assert "TRELLIS_LEASE_RETRY_PERIOD" in describe_error(CertmanagerSettings, refused.value)
    monkeypatch.setenv("TRELLIS_CERTMANAGER_LEASE_RETRY_PERIOD", "1")
    settings = CertmanagerSettings()
    assert (settings.lease_duration, settings.lease_renew_deadline) == (8, 6)
    assert settings.leader_election == "auto"


async def test_the_settings_choose_the_lock(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("TRELLIS_INSTANCE", "certmanager-7")
    local = leadership.elect_for(CertmanagerSettings(), redis=redis_client)
    assert isinstance(local.lock, redislocks.RedisLock)
    assert local.lock.key == "trellis:leader:certmanager"
    assert (local.name, local.identity) == ("certmanager", "certmanager-7")
    with KubeApi() as api:
        config = api.write_kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.setenv("TRELLIS_LEASE_NAMESPACE", "mesh-system")
        auto = leadership.elect_for(CertmanagerSettings(kubeconfig=config), redis=redis_client)
        assert isinstance(auto.lock, leases.LeaseLock)
        assert auto.lock.description == "Lease mesh-system/trellis-certmanager"
        monkeypatch.setenv("TRELLIS_LEADER_ELECTION", "redis")
        chosen = leadership.elect_for(CertmanagerSettings(kubeconfig=config), redis=redis_client)
        assert isinstance(chosen.lock, redislocks.RedisLock)


def test_the_lease_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod_file = tmp_path / "namespace"
    pod_file.write_text("mesh\n")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert leases.namespace("", pod_file) == leases.DEFAULT_NAMESPACE
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert leases.namespace("", pod_file) == "mesh"
    assert leases.namespace("other", pod_file) == "other"


async def test_a_standby_is_ready_and_says_so(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    health = Health(registry, instance="certmanager-2")
    app = admin.create_app("certmanager", registry, health=health)
    transport = httpx.ASGITransport(app=app)
    url = redis_server.url
    async with (
        httpx.AsyncClient(transport=transport, base_url="http://t") as client,
        redis.asyncio.Redis.from_url(url) as leader_redis,
        redis.asyncio.Redis.from_url(url) as own_redis,
    ):
        leader = leadership.elect("certmanager", "certmanager-1", redis=leader_redis, timing=TIMING)
        standby = leadership.elect(
            "certmanager", "certmanager-2", redis=own_redis, timing=TIMING, health=health
        )
        async with leader_and_standby(leader, standby):
            ready = await client.get("/readyz")
            assert ready.status_code == 200
            assert ready.json()["roles"] == {"certmanager": "standby"}
            assert ready.json()["checks"]["loop:leader:certmanager"] is True
            status = (await client.get("/v1/status")).json()
            assert status["instance"] == "certmanager-2"
            (role,) = status["leadership"]
            assert role["name"] == "certmanager"
            assert role["leading"] is False
            assert role["holder"] == "certmanager-1"
            assert role["token"] == 1
            assert registry.get_sample_value("trellis_leader", {"name": "certmanager"}) == 0
        # both stopped (the leader released): this replica, restarted, leads
        again = leadership.elect(
            "certmanager", "certmanager-2", redis=own_redis, timing=TIMING, health=health
        )
        async with running(again):
            assert await again.wait_leading(asyncio.Event())
            assert registry.get_sample_value("trellis_leader", {"name": "certmanager"}) == 1
            ready = await client.get("/readyz")
            assert ready.json()["roles"] == {"certmanager": "leader"}
            (role,) = (await client.get("/v1/status")).json()["leadership"]
            assert role["leading"] is True
            assert role["token"] == 2


async def test_an_election_that_cannot_reach_its_server_is_a_down_loop() -> None:
    registry = CollectorRegistry()
    health = Health(registry, instance="certmanager-1")
    async with redis.asyncio.Redis(port=free_port(), socket_connect_timeout=0.5) as nowhere:
        replica = leadership.elect(
            "certmanager", "certmanager-1", redis=nowhere, timing=TIMING, health=health
        )
        app = admin.create_app("certmanager", registry, health=health)
        transport = httpx.ASGITransport(app=app)
        async with (
            running(replica),
            httpx.AsyncClient(transport=transport, base_url="http://t") as client,
        ):
            await eventually(lambda: health.loops.down())
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            assert "loop:leader:certmanager" in ready.json()["reasons"]
            assert ready.json()["roles"] == {"certmanager": "standby"}
            assert not replica.leading


async def test_role_changes_are_counted_and_called_back(redis_server: RedisServer) -> None:
    registry = CollectorRegistry()
    health = Health(registry)
    seen: list[bool] = []
    async with redis.asyncio.Redis.from_url(redis_server.url) as client:
        replica = leadership.elect(
            "endpoints-vm", "endpoints-vm-1", redis=client, timing=TIMING, health=health
        )
        replica.subscribe(seen.append)
        async with running(replica):
            assert await replica.wait_leading(asyncio.Event())
        assert not replica.leading
    assert seen == [True, False]
    transitions = registry.get_sample_value(
        "trellis_leader_transitions_total", {"name": "endpoints-vm"}
    )
    assert transitions == 2


async def test_leader_only_work_runs_for_each_term_and_ends_with_it(
    redis_server: RedisServer, redis_admin: redis.asyncio.Redis
) -> None:
    terms: list[int] = []

    async with redis.asyncio.Redis.from_url(redis_server.url) as client:
        replica = leadership.elect("certmanager", "certmanager-1", redis=client, timing=TIMING)

        async def rotate(over: asyncio.Event) -> None:
            terms.append(replica.token)
            await over.wait()
            assert not replica.leading or stop.is_set()

        stop = asyncio.Event()
        async with running(replica):
            work = asyncio.create_task(replica.lead(stop, rotate))
            await eventually(lambda: terms == [1])
            # another replica takes the lock from under it (as after a partition): the
            # term ends, and the next one starts with a larger token
            await redis_admin.set(redislocks.lock_key("certmanager"), "certmanager-2", px=300)
            await eventually(lambda: terms == [1, 2], timeout=10)
            stop.set()
            await work
