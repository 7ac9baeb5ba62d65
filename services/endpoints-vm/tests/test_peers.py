"""A replica alone signals nothing; one that finds another says ``joined`` to it.

:class:`~trellis_endpoints_vm.mirroring.Peers` with a registry lookup and an announcer of
the test's own (the replicas on a real Redis are in ``test_replicas.py``), and the
:class:`~trellis_endpoints_vm.mirroring.Signals` it lets through or holds back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from trellis_endpoints_vm.mirroring import GRACE, HELLO, JOINED, Peers, Signals


@dataclass
class Registry:
    """What the lookup answers (instance names), or the error it raises."""

    listed: list[str] = field(default_factory=list)
    error: Exception | None = None
    lookups: int = 0
    thrice: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self) -> list[str]:
        self.lookups += 1
        if self.lookups >= 3:
            self.thrice.set()
        if self.error is not None:
            raise self.error
        return list(self.listed)


@dataclass
class Said:
    """Every (kind, key) announced on the replicas' topic."""

    signals: list[tuple[str, str]] = field(default_factory=list)

    async def __call__(self, kind: str, key: str) -> int:
        self.signals.append((kind, key))
        return 1


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def registry() -> Registry:
    return Registry(listed=["vm-a"])  # a registry lists this replica too


@pytest.fixture
def said() -> Said:
    return Said()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def peers(registry: Registry, said: Said, clock: Clock) -> Peers:
    return Peers("vm-a", registry, said, clock=clock)


async def test_until_the_registry_answers_a_replica_signals_as_if_it_had_company(
    peers: Peers,
) -> None:
    assert not peers.known
    assert not peers.alone()


async def test_a_replica_the_registry_lists_alone_is_alone(peers: Peers, said: Said) -> None:
    await peers.refresh()
    assert peers.known
    assert peers.alone()
    assert peers.others == []
    assert said.signals == []


async def test_replicas_listed_at_the_first_lookup_are_not_welcomed(
    peers: Peers, registry: Registry, said: Said
) -> None:
    """Until the first answer every change was signalled: nothing to read back."""
    registry.listed = ["vm-a", "vm-b"]
    await peers.refresh()
    assert not peers.alone()
    assert peers.others == ["vm-b"]
    assert said.signals == []


async def test_a_replica_found_later_in_the_registry_is_told_to_read_everything_back(
    peers: Peers, registry: Registry, said: Said
) -> None:
    await peers.refresh()
    registry.listed = ["vm-a", "vm-c", "vm-b"]
    await peers.refresh()
    assert not peers.alone()
    assert said.signals == [(JOINED, "vm-b"), (JOINED, "vm-c")]
    assert peers.welcomed == 2
    await peers.refresh()  # known now: welcomed once
    assert len(said.signals) == 2


async def test_a_replica_heard_on_the_topic_is_welcomed_once(peers: Peers, said: Said) -> None:
    await peers.refresh()
    await peers.heard("vm-a")  # its own signal coming back
    assert peers.alone()
    await peers.heard("vm-b")  # its hello, or any signal of its
    assert not peers.alone()
    await peers.heard("vm-b")
    assert said.signals == [(JOINED, "vm-b")]


async def test_a_replica_heard_before_the_first_lookup_is_welcomed(
    peers: Peers, said: Said
) -> None:
    await peers.heard("vm-b")
    assert said.signals == [(JOINED, "vm-b")]
    await peers.refresh()  # the registry does not list it yet: heard just now, kept
    assert peers.others == ["vm-b"]


async def test_a_replica_neither_listed_nor_heard_for_the_grace_is_gone(
    peers: Peers, registry: Registry, clock: Clock
) -> None:
    registry.listed = ["vm-a", "vm-b"]
    await peers.refresh()
    registry.listed = ["vm-a"]  # its record expired: it died, or lost Redis
    clock.now += GRACE / 2
    await peers.refresh()
    assert peers.others == ["vm-b"]  # it may only be slow to announce
    clock.now += GRACE
    await peers.refresh()
    assert peers.alone()


async def test_a_signal_keeps_a_replica_known_without_its_record(
    peers: Peers, registry: Registry, clock: Clock, said: Said
) -> None:
    await peers.refresh()
    await peers.heard("vm-b")
    clock.now += GRACE * 0.9
    await peers.heard("vm-b")
    clock.now += GRACE * 0.9
    await peers.refresh()
    assert peers.others == ["vm-b"]
    assert said.signals == [(JOINED, "vm-b")]


async def test_a_failed_lookup_raises_and_what_was_known_stays(
    peers: Peers, registry: Registry
) -> None:
    registry.listed = ["vm-a", "vm-b"]
    await peers.refresh()
    registry.error = ConnectionError("Redis is down")
    with pytest.raises(ConnectionError):
        await peers.refresh()
    assert peers.others == ["vm-b"]
    assert not peers.alone()


async def test_a_failed_first_lookup_leaves_the_replica_signalling(
    peers: Peers, registry: Registry
) -> None:
    registry.error = ConnectionError("Redis is down")
    with pytest.raises(ConnectionError):
        await peers.refresh()
    assert not peers.known
    assert not peers.alone()


async def test_hello_names_the_replica(peers: Peers, said: Said) -> None:
    await peers.hello()
    assert said.signals == [(HELLO, "vm-a")]


async def test_the_lookup_runs_until_stopped(peers: Peers, registry: Registry) -> None:
    stop = asyncio.Event()
    running = asyncio.create_task(peers.run(stop, interval=0.001))
    await asyncio.wait_for(registry.thrice.wait(), 5)
    stop.set()
    await asyncio.wait_for(running, 5)
    assert peers.known


async def test_signals_are_held_back_while_alone_and_counted(said: Said) -> None:
    alone = [True]
    skipped: list[int] = []
    signals = Signals(said, timeout=1.0, alone=lambda: alone[0], skipped=skipped.append)
    await signals.send([("changed", "shop/vm-1"), ("expired", "shop/vm-2")])
    await signals.sent()
    assert said.signals == []
    assert skipped == [2]
    alone[0] = False
    await signals.send([("changed", "shop/vm-1")])
    await signals.sent()
    assert said.signals == [("changed", "shop/vm-1")]
    assert skipped == [2]
