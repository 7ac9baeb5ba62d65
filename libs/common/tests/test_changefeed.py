"""ChangeFeed: each watcher gets every key changed since it last took them, once each."""

from __future__ import annotations

import asyncio

from trellis_common.changefeed import ChangeFeed


async def test_keys_changed_while_a_watcher_was_busy_come_once_each_in_first_change_order() -> None:
    feed: ChangeFeed[str] = ChangeFeed()
    with feed.watch() as watch:
        feed.changed(["b", "a"])
        feed.changed(["b", "c"])  # b again: still once, where it first came
        assert await watch.next() == ["b", "a", "c"]
        feed.changed(["a"])
        assert await watch.next() == ["a"]


async def test_a_watcher_waits_for_a_change_and_each_watcher_gets_its_own() -> None:
    feed: ChangeFeed[str] = ChangeFeed()
    with feed.watch() as first, feed.watch() as second:
        waiting = asyncio.create_task(first.next())
        await asyncio.sleep(0)
        assert not waiting.done()
        feed.changed(["x"])
        assert await asyncio.wait_for(waiting, 1) == ["x"]
        assert await second.next() == ["x"]  # not taken from it by the first
        assert feed.watchers == 2
    assert feed.watchers == 0
    feed.changed(["y"])  # nobody watches: nothing is kept


async def test_no_keys_is_no_change() -> None:
    feed: ChangeFeed[str] = ChangeFeed()
    with feed.watch() as watch:
        feed.changed([])
        waiting = asyncio.create_task(watch.next())
        for _ in range(5):  # turns of the event loop, no time: nothing woke it
            await asyncio.sleep(0)
        assert not waiting.done()
        feed.changed(["z"])
        assert await asyncio.wait_for(waiting, 1) == ["z"]


def test_take_drains_without_waiting() -> None:
    feed: ChangeFeed[str] = ChangeFeed()
    with feed.watch() as watch:
        assert watch.take() == []
        feed.changed(["a", "b", "a"])
        assert watch.take() == ["a", "b"]
        assert watch.take() == []
