"""follow_forever: every failure ends a session, never the loop, and shows on the loop."""

from __future__ import annotations

import asyncio

from trellis_runtime.follow import follow_forever
from trellis_runtime.health import Health


async def test_a_session_that_raises_anything_is_restarted_and_reported() -> None:
    health = Health()
    loop = health.loops.register("provider endpoints-vm")
    stop = asyncio.Event()
    sessions: list[int] = []
    seen_down: list[str] = []

    async def session() -> None:
        sessions.append(len(sessions))
        if len(sessions) == 1:
            raise ValueError("'payments.example.com' is not a valid service name")
        seen_down.append(loop.reason)
        loop.up()
        stop.set()

    await asyncio.wait_for(
        follow_forever(session, stop, what="provider", loop=loop, initial=0.001), timeout=5
    )

    assert sessions == [0, 1]
    assert seen_down == ["ValueError: 'payments.example.com' is not a valid service name"]
    assert loop.restarts == 1
    assert list(health.loops) == []  # the loop leaves the table once it stops


async def test_a_loop_stays_down_while_failures_repeat() -> None:
    health = Health()
    loop = health.loops.register("certmanager")
    stop = asyncio.Event()
    failures = 0

    async def session() -> None:
        nonlocal failures
        failures += 1
        if failures == 3:
            assert health.loops.down() == {"certmanager": "RuntimeError: boom 2"}
            stop.set()
            return
        raise RuntimeError(f"boom {failures}")

    await asyncio.wait_for(
        follow_forever(session, stop, what="certmanager", loop=loop, initial=0.001), timeout=5
    )
    assert failures == 3
    assert loop.restarts == 2


def test_rejections_are_kept_until_accepted_and_bounded() -> None:
    health = Health()
    rejections = health.rejections
    rejections.reject("spec", "a.yaml", "bad")
    rejections.reject("spec", "a.yaml", "bad")
    rejections.reject("redis", "trellis:cert:x", "truncated JSON")
    assert [(r.key, r.count) for r in rejections.items()] == [
        ("a.yaml", 2),
        ("trellis:cert:x", 1),
    ]
    rejections.accept("spec", "a.yaml")
    assert [r.key for r in rejections.items()] == ["trellis:cert:x"]
    rejections.accept_all("redis")
    assert len(rejections) == 0
    for n in range(300):
        rejections.reject("flood", str(n), "bad")
    assert len(rejections) == 200
    assert rejections.items()[0].key == "100"


async def test_a_stop_during_the_backoff_ends_the_loop_at_once() -> None:
    health = Health()
    loop = health.loops.register("certmanager")
    stop = asyncio.Event()
    lost = asyncio.Event()
    sessions = 0

    async def session() -> None:
        nonlocal sessions
        sessions += 1
        raise RuntimeError("boom")

    # an hour between sessions: the test passes only if stop cuts the wait short
    hour = {"initial": 3600.0, "maximum": 3600.0}
    following = asyncio.create_task(
        follow_forever(session, stop, what="certmanager", loop=loop, on_lost=lost.set, **hour)
    )
    await lost.wait()
    stop.set()
    await following
    assert sessions == 1
    assert list(health.loops) == []


async def test_a_session_that_ends_cleanly_is_started_again() -> None:
    health = Health()
    loop = health.loops.register("certmanager")
    stop = asyncio.Event()
    reasons: list[str] = []

    async def session() -> None:
        reasons.append(loop.reason)
        if len(reasons) == 3:
            stop.set()

    await follow_forever(session, stop, what="certmanager", loop=loop, initial=0.001)
    assert reasons == ["starting", "stream ended", "stream ended"]
