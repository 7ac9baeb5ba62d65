"""Rotation and pruning on the leader only, fenced (``rotation.py``, ``claims.py``): two
replicas on one real Redis, their leaderships decided by the test (``testing.Leadership``,
the shape of ``trellis_kube.leadership.Leadership``)."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import redis.asyncio

from trellis_certmanager import rotation
from trellis_certmanager.domain.errors import Deposed
from trellis_certmanager.domain.records import CertificateRecord
from trellis_certmanager.manager import CertificateManager
from trellis_certmanager.testing import Leadership, proxy_key
from trellis_common.model import MeshService
from trellis_kube.leadership import Timing, elect
from trellis_testing.waiting import eventually

from .conftest import FakeClock, issued

BOOKSTORE = MeshService("bookstore", "bookstore")
WANTED = "trellis:certmanager:wanted"


def past_renewal(clock: FakeClock, record: CertificateRecord) -> None:
    """Move the clock past ``record``'s renewal point (still before it expires)."""
    clock.advance(record.renew_after - clock.now + dt.timedelta(minutes=1))


async def rotated_from(replica: CertificateManager, record: CertificateRecord) -> bool:
    return (await replica.lookup(record.common_name)).serial != record.serial


async def test_only_the_leader_rotates(
    pair: tuple[CertificateManager, CertificateManager], clock: FakeClock
) -> None:
    a, b = pair
    lead_a, lead_b = Leadership(identity="a"), Leadership(identity="b")
    lead_a.acquire(1)
    service = await b.issue_service(BOOKSTORE)  # issued on the standby: any replica issues
    past_renewal(clock, service)
    stop = asyncio.Event()
    loops = [
        asyncio.create_task(rotation.run(r, stop, 0.01, lead))
        for r, lead in ((a, lead_a), (b, lead_b))
    ]
    await eventually(lambda: rotated_from(b, service))
    stop.set()
    passes_a, passes_b = await asyncio.gather(*loops)
    assert passes_a >= 1
    assert passes_b == 0  # the standby made no pass at all
    assert issued(a, "service") + issued(b, "service") == 2  # issued once, rotated once


async def test_a_deposed_leader_s_late_writes_are_refused(
    pair: tuple[CertificateManager, CertificateManager], clock: FakeClock
) -> None:
    a, b = pair
    service = await a.issue_service(BOOKSTORE)
    proxy = await a.issue_proxy(BOOKSTORE, public_key=proxy_key())
    await a.take_fence(1)  # a led, with token 1; then paused, and b was elected
    past_renewal(clock, service)
    await b.reload()  # as its rotation loop does when it starts leading
    await rotation.one_pass(b, set(), fence=2)
    rotated = await b.lookup(service.common_name)
    assert rotated.serial != service.serial

    # a wakes up, still believing it leads: every write it makes with token 1 is refused
    with pytest.raises(Deposed):
        await rotation.one_pass(a, set(), fence=1)
    with pytest.raises(Deposed):
        await a.rotate(service.common_name, "expiring", fence=1)
    clock.advance(dt.timedelta(days=30))  # long expired, past the pruning grace
    with pytest.raises(Deposed):
        await a.prune_expired(fence=1)
    assert (await b.lookup(service.common_name)).serial == rotated.serial
    assert (await b.lookup(proxy.common_name)).serial == proxy.serial  # not pruned by a
    assert issued(a, "service") + issued(b, "service") == 2

    assert await b.prune_expired(fence=2) == 2  # the leader in force prunes both
    assert b.list() == []
    assert len(a.list()) == 2  # pruning rings no signal: the standby drops them itself
    assert a.forget_pruned() == 2
    assert a.list() == []


async def test_after_a_leader_change_the_new_leader_rotates_what_is_due(
    pair: tuple[CertificateManager, CertificateManager], clock: FakeClock
) -> None:
    """The new leader rotates a certificate the old one issued, and that it never held in
    memory (it follows no signals here): it reads every record when it starts leading."""
    a, b = pair
    await rotation.one_pass(a, set(), fence=1)  # a led first
    service = await a.issue_service(BOOKSTORE)
    assert b.list() == []
    lead_b = Leadership(identity="b")
    lead_b.acquire(2)
    past_renewal(clock, service)
    stop = asyncio.Event()
    loop = asyncio.create_task(rotation.run(b, stop, 0.01, lead_b))
    await eventually(lambda: rotated_from(a, service))
    stop.set()
    assert await loop >= 1
    assert issued(b, "service") == 1  # the rotation, once
    assert issued(a, "service") == 1  # the first issuance


async def test_with_real_elections_one_replica_rotates_and_a_successor_takes_over(
    pair: tuple[CertificateManager, CertificateManager],
    clients: tuple[redis.asyncio.Redis, redis.asyncio.Redis],
    clock: FakeClock,
) -> None:
    """``trellis_kube.leadership`` on a Redis lock, as certmanager's own Redis user: the
    leader rotates, the standby does not; the leader is killed (its tasks cancelled, the
    lock left to expire), the other replica is elected and rotates what is due next, as
    asked for on the replica that died (the asks are shared: demand.py)."""
    timing = Timing(duration=2.0, renew_deadline=1.4, retry_period=0.2)
    elections = [
        elect("certmanager", f"certmanager-{n}", redis=c, timing=timing)
        for n, c in zip("ab", clients, strict=True)
    ]
    stop = asyncio.Event()
    tasks = {
        replica: [
            asyncio.create_task(election.run(stop)),
            asyncio.create_task(rotation.run(replica, stop, 0.05, election)),
        ]
        for replica, election in zip(pair, elections, strict=True)
    }
    try:
        await eventually(lambda: any(e.leading for e in elections))
        leader = next(e for e in elections if e.leading)
        first, second = pair if leader is elections[0] else pair[::-1]
        successor = elections[1] if leader is elections[0] else elections[0]
        service = await second.issue_service(BOOKSTORE)
        past_renewal(clock, service)
        await eventually(lambda: rotated_from(second, service))
        # rotated once (the metric follows the stored record): by the leader, or by the
        # other replica if the lease moved meanwhile (2 s leases, on a loaded machine)
        await eventually(lambda: issued(first, "service") + issued(second, "service") == 2)
        assert issued(second, "service") in (1, 2)  # its first issuance, maybe the rotation

        # the catalog asks either one for it (a name asked for is wanted: demand.py)
        rotated = await first.lookup(service.common_name, wanted=True)
        assert rotated.serial != service.serial

        async def shared() -> bool:
            asked = await clients[0].hget(WANTED, service.common_name)
            return asked is not None and float(asked) >= clock.now.timestamp()

        await eventually(shared)
        for task in tasks.pop(first):  # kill -9: nothing released, nothing more shared
            task.cancel()
        await eventually(lambda: successor.leading, timeout=10)
        assert successor.token > leader.token  # the fence refuses the old leader from now on
        past_renewal(clock, rotated)
        await eventually(lambda: rotated_from(second, rotated), timeout=10)
        # the successor rotated it, once: the metrics count three in all
        await eventually(lambda: issued(first, "service") + issued(second, "service") == 3)
    finally:
        stop.set()
        for task in (t for ts in tasks.values() for t in ts):
            task.cancel()
        await asyncio.gather(*(t for ts in tasks.values() for t in ts), return_exceptions=True)
