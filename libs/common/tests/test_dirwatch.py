from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path
from typing import Literal

import pytest

from trellis_common import dirwatch
from trellis_common.dirwatch import DirWatcher, Plan, StopFlag
from trellis_testing import eventually


def no_inotify(dirs: list[str]) -> dirwatch.Notifier:
    raise OSError(errno.ENOSPC, "inotify watch limit reached")


class Counter:
    """A scanner that counts its scans and always asks to watch ``dirs``."""

    def __init__(self, dirs: frozenset[str]) -> None:
        self.dirs = dirs
        self.scans = 0

    async def __call__(self) -> Plan:
        self.scans += 1
        return Plan(self.dirs)


async def test_falls_back_to_polling_logged_once_and_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watcher = DirWatcher(str(tmp_path), rescan=3600, poll=0.01, opener=no_inotify)
    scan = Counter(frozenset({str(tmp_path)}))
    stop = asyncio.Event()
    with caplog.at_level(logging.INFO, logger="trellis_common.dirwatch"):
        task = asyncio.create_task(watcher.run(stop, scan))
        try:
            await eventually(lambda: scan.scans >= 5)  # polled, not waiting for the rescan
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=2)

    assert watcher.mode.as_dict() == {
        "mode": "polling",
        "reason": "cannot watch with inotify: [Errno 28] inotify watch limit reached",
    }
    assert sum("dirwatch.polling" in r.getMessage() for r in caplog.records) == 1


class Broken:
    """A notifier whose wait fails once, as watchfiles does when its thread sees an error."""

    def __init__(self) -> None:
        self.closed = False

    def watch(
        self, debounce_ms: int, step_ms: int, timeout_ms: int, stop_event: StopFlag
    ) -> set[tuple[int, str]] | Literal["signal", "stop", "timeout"]:
        raise RuntimeError("error in underlying watcher")

    def close(self) -> None:
        self.closed = True


async def test_a_broken_watch_is_remade(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    opened: list[dirwatch.Notifier] = []

    def opener(dirs: list[str]) -> dirwatch.Notifier:
        notifier = Broken() if not opened else dirwatch.inotify(dirs)
        opened.append(notifier)
        return notifier

    watcher = DirWatcher(str(tmp_path), rescan=3600, poll=0.01, opener=opener)
    scan = Counter(frozenset({str(tmp_path)}))
    stop = asyncio.Event()
    task = asyncio.create_task(watcher.run(stop, scan))
    try:
        await eventually(lambda: len(opened) == 2)
        before = scan.scans
        (tmp_path / "a.yaml").write_text("x: 1\n")  # seen by the new watch
        await eventually(lambda: scan.scans > before)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=2)

    assert isinstance(opened[0], Broken)
    assert opened[0].closed
    assert watcher.mode.kind == "inotify"
    assert any("dirwatch.failed" in r.getMessage() for r in caplog.records)
