"""Leader election on a Kubernetes Lease, with the official client against the API emulator.

Each replica has its own kubeconfig (its own client name), so the emulator can partition one
of them from the API server. The timings are short (a 2 s lease) to keep the tests quick;
what they assert is ordering against the Lease's own timestamps, never a speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trellis_kube import client as kube_client
from trellis_kube import leadership, leases
from trellis_kube.leadership import Leadership, Timing
from trellis_runtime.health import Health
from trellis_testing import eventually
from trellis_testing.elections import Contenders, leader_among, leader_and_standby, running
from trellis_testing.kube import KubeApi

NAMESPACE = "trellis-system"
TIMING = Timing(duration=2.0, renew_deadline=1.4, retry_period=0.2)

Elect = Callable[[str], Leadership]


@pytest.fixture
def api() -> Iterator[KubeApi]:
    with KubeApi() as server:
        yield server


@pytest.fixture
def elect(api: KubeApi, tmp_path: Path) -> Iterator[Elect]:
    """A replica of the election ``certmanager`` named ``identity``, with its own client."""
    clients: list[Any] = []

    def make(identity: str) -> Leadership:
        config = api.write_kubeconfig(tmp_path / f"{identity}.kubeconfig", client=identity)
        clients.append(kube_client.api_client(config))
        return leadership.elect(
            "certmanager",
            identity,
            kube_api=clients[-1],
            namespace=NAMESPACE,
            timing=TIMING,
            health=Health(),
        )

    yield make
    for client in clients:
        client.close()


def lease(api: KubeApi) -> dict[str, Any]:
    (found,) = [
        obj
        for obj in api.objects("coordination.k8s.io", "leases")
        if obj["metadata"]["name"] == "trellis-certmanager"
    ]
    return found


def written(api: KubeApi) -> list[dict[str, Any]]:
    """Every spec the Lease has had, from the server's history."""
    assert api.server is not None
    return [event.obj["spec"] for event in list(api.server.history) if event.plural == "leases"]


def renewals_by(api: KubeApi, identity: str) -> list[float]:
    """Every renewTime ``identity`` wrote to the Lease."""
    return [
        leases.parse_micro_time(spec["renewTime"])
        for spec in written(api)
        if spec.get("holderIdentity") == identity
    ]


async def test_the_lease_is_served_and_discovered(api: KubeApi, tmp_path: Path) -> None:
    from kubernetes import client

    api_client: Any = kube_client.api_client(api.write_kubeconfig(tmp_path / "k"))
    try:
        found = client.CoordinationV1Api(api_client).get_api_resources()
        assert "leases" in {r.name for r in found.resources}
        body: Any = {"metadata": {"name": "x"}, "spec": {"leaseDurationSeconds": 0}}
        with pytest.raises(client.ApiException) as refused:
            client.CoordinationV1Api(api_client).create_namespaced_lease(NAMESPACE, body)
        assert refused.value.status == 422
        assert "leaseDurationSeconds" in str(refused.value.body)
    finally:
        api_client.close()


async def test_acquires_renews_and_a_standby_observes(api: KubeApi, elect: Elect) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with running(a):
        assert await a.wait_leading(asyncio.Event())
        first = lease(api)["spec"]
        assert first["holderIdentity"] == "certmanager-1"
        assert first["leaseDurationSeconds"] == 2
        assert first["leaseTransitions"] == 0
        assert a.token == 1
        assert a.holder == "certmanager-1"
        async with running(b):
            await eventually(lambda: b.holder == "certmanager-1")
            # renewals move renewTime on and keep the term (acquireTime, transitions)
            await eventually(lambda: lease(api)["spec"]["renewTime"] != first["renewTime"])
            renewed = lease(api)["spec"]
            assert renewed["acquireTime"] == first["acquireTime"]
            assert renewed["leaseTransitions"] == 0
            await eventually(lambda: len(renewals_by(api, "certmanager-1")) > TIMING.duration / 0.2)
            assert a.leading
            assert not b.leading
            assert b.token == 1


async def test_a_killed_leader_is_replaced_after_its_lease_expires(
    api: KubeApi, elect: Elect
) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with leader_and_standby(a, b) as (_, a_task):
        async with Contenders((a, b)) as watch:
            a_task.cancel()  # killed: no release
            assert await b.wait_leading(asyncio.Event())
        spec = lease(api)["spec"]
        assert spec["holderIdentity"] == "certmanager-2"
        assert spec["leaseTransitions"] == 1
        assert b.token == 2
        # b took over only once a's last renewal had expired
        expired_at = max(renewals_by(api, "certmanager-1")) + spec["leaseDurationSeconds"]
        assert leases.parse_micro_time(spec["acquireTime"]) >= expired_at
        assert watch.samples
        assert not watch.overlaps


async def test_a_clean_stop_releases_and_a_standby_takes_over_before_expiry(
    api: KubeApi, elect: Elect
) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with leader_and_standby(a, b) as (a_stop, a_task):
        async with Contenders((a, b)) as watch:
            a_stop.set()
            await a_task
            assert await b.wait_leading(asyncio.Event())
        assert not a.leading
        # released: holder emptied, so b did not wait for the lease to expire
        assert any(
            s["holderIdentity"] == "" and s["leaseDurationSeconds"] == 1 for s in written(api)
        )
        spec = lease(api)["spec"]
        last_renewal = max(renewals_by(api, "certmanager-1"))
        assert leases.parse_micro_time(spec["acquireTime"]) < last_renewal + TIMING.duration
        assert spec["leaseTransitions"] == 1
        assert b.token == 2
        assert watch.samples
        assert not watch.overlaps


async def test_contenders_never_both_lead_through_handovers(api: KubeApi, elect: Elect) -> None:
    replicas = [elect(f"certmanager-{n}") for n in range(3)]
    stops = [asyncio.Event() for _ in replicas]
    async with Contenders(tuple(replicas)) as watch:
        tasks = [asyncio.create_task(r.run(s)) for r, s in zip(replicas, stops, strict=True)]
        try:
            leader = await leader_among(replicas)
            stops[replicas.index(leader)].set()  # a clean handover
            after = await leader_among(replicas, besides=[leader])
            tasks[replicas.index(after)].cancel()  # then a killed leader
            await eventually(
                lambda: any(r.leading for r in replicas if r not in (leader, after)), timeout=10
            )
        finally:
            for stop in stops:
                stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert watch.samples > 100
    assert not watch.overlaps, watch.overlaps
    tokens = watch.elected_tokens()
    assert tokens == [1, 2, 3]


async def test_concurrent_acquisitions_one_wins_the_others_conflict(
    api: KubeApi, tmp_path: Path
) -> None:
    clients: list[Any] = [
        kube_client.api_client(api.write_kubeconfig(tmp_path / f"{n}", client=f"r{n}"))
        for n in range(4)
    ]
    try:
        locks = [
            leases.LeaseLock(client, NAMESPACE, "certmanager", f"r{n}", 2.0)
            for n, client in enumerate(clients)
        ]
        # absent: every one creates, one is first (409 AlreadyExists for the others)
        seen = await asyncio.gather(*(lock.attempt(False, 0.0) for lock in locks))
        assert sum(s.acquired for s in seen) == 1
        winner = next(lock for lock, s in zip(locks, seen, strict=True) if s.acquired)
        await winner.release()
        # free: every one replaces the same resourceVersion, one wins (409 Conflict)
        seen = await asyncio.gather(*(lock.attempt(False, time.time()) for lock in locks))
        assert sum(s.acquired for s in seen) == 1
        (token,) = {s.token for s in seen if s.acquired}
        assert token == 2 == lease(api)["spec"]["leaseTransitions"] + 1
        assert all(s.holder in (lease(api)["spec"]["holderIdentity"], "") for s in seen)
    finally:
        for client in clients:
            client.close()


async def test_a_partitioned_leader_steps_down_before_its_lease_expires(
    api: KubeApi, elect: Elect
) -> None:
    a, b = elect("certmanager-1"), elect("certmanager-2")
    async with leader_and_standby(a, b):
        async with Contenders((a, b)) as watch:
            with api.partitioned("certmanager-1"):
                assert await b.wait_leading(asyncio.Event())
                assert not a.leading  # still cut off: it knows it does not lead
            await eventually(lambda: a.holder == "certmanager-2")
        expires = (
            max(renewals_by(api, "certmanager-1")) + lease(api)["spec"]["leaseDurationSeconds"]
        )
        # a stopped believing it led (its own property, and its callbacks) before the lease
        # it had renewed last could expire; b took over only after that
        assert watch.last_leading["certmanager-1"] < expires
        assert watch.stepped_down("certmanager-1") < expires
        assert leases.parse_micro_time(lease(api)["spec"]["acquireTime"]) >= expires
        assert not watch.overlaps
        assert not a.leading
        assert b.leading
        assert b.token == 2
