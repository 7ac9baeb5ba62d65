"""The supervisor: processes started side by side in their order, and their log files,
rotated by size so a long-running mesh never fills the disk."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from trellis_cli.supervisor import (
    LogRotation,
    ProcessSpec,
    RotatingFile,
    StartupError,
    Supervisor,
    parse_size,
)
from trellis_common.backoff import Backoff
from trellis_testing import eventually


@pytest.mark.parametrize(
    ("text", "size"),
    [("1048576", 1048576), ("10MiB", 10 * 2**20), ("512k", 512 * 1024), ("2 GB", 2 * 2**30)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "ten", "10 parsecs", "-1"])
def test_parse_size_names_a_bad_size(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_rotation_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max bytes"):
        LogRotation(0, 1)
    with pytest.raises(ValueError, match="backups"):
        LogRotation(10, -1)


def sizes(log_dir: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(log_dir.iterdir())}


def test_a_file_rotates_without_splitting_lines_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "svc.log"
    lines = [f"line {i:04d} {'x' * 40}\n".encode() for i in range(1000)]  # 51 bytes each
    with RotatingFile(path, LogRotation(max_bytes=1000, backups=2)) as sink:
        for line in lines:
            sink.write(line)
    assert sorted(sizes(tmp_path)) == ["svc.log", "svc.log.1", "svc.log.2"]
    assert all(size <= 1000 for size in sizes(tmp_path).values())
    newest = path.read_bytes().splitlines(keepends=True)
    previous = (tmp_path / "svc.log.1").read_bytes().splitlines(keepends=True)
    assert newest[-1] == lines[-1]
    assert previous + newest == lines[-len(previous) - len(newest) :]  # in order, whole lines


def test_without_backups_the_file_starts_over(tmp_path: Path) -> None:
    with RotatingFile(tmp_path / "svc.log", LogRotation(max_bytes=100, backups=0)) as sink:
        for i in range(50):
            sink.write(f"{i:09d}\n".encode())
    assert sizes(tmp_path) == {"svc.log": 100}


def test_a_reopened_file_counts_what_it_already_holds(tmp_path: Path) -> None:
    path = tmp_path / "svc.log"
    path.write_bytes(b"x" * 90 + b"\n")
    with RotatingFile(path, LogRotation(max_bytes=100, backups=1)) as sink:
        sink.write(b"0123456789\n")
    assert sizes(tmp_path) == {"svc.log": 11, "svc.log.1": 91}


async def test_a_chatty_process_leaves_bounded_rotated_logs(tmp_path: Path) -> None:
    async def ready() -> bool:
        return True

    count, max_bytes = 20_000, 64 * 1024
    script = f"for i in range({count}): print(f'line {{i:06d}} ' + 'x' * 80)"  # ~1.9 MB
    echoed: list[str] = []
    log_dir = tmp_path / "logs"
    supervisor = Supervisor(
        [ProcessSpec("chatty", [sys.executable, "-c", script], ready)],
        log_dir,
        lambda name, line: echoed.append(line),
        rotation=LogRotation(max_bytes=max_bytes, backups=2),
    )
    await supervisor.start()
    [child] = supervisor.children
    assert child.pump is not None
    assert child.process is not None
    await child.pump  # the child's output, to its end
    assert await child.process.wait() == 0

    assert sorted(sizes(log_dir)) == ["chatty.log", "chatty.log.1", "chatty.log.2"]
    assert sum(sizes(log_dir).values()) <= 3 * max_bytes
    assert (log_dir / "chatty.log").read_text().splitlines()[-1].startswith(f"line {count - 1:06d}")
    assert len(echoed) == count  # the terminal still sees every line


async def test_a_line_longer_than_the_pipe_buffer_does_not_stop_the_pump(tmp_path: Path) -> None:
    """A long one-line traceback once ended the pump; the child then blocked on its pipe."""

    async def ready() -> bool:
        return True

    script = "print('x' * 300_000); print('after'); print('the end', end='')"
    echoed: list[str] = []
    log_dir = tmp_path / "logs"
    supervisor = Supervisor(
        [ProcessSpec("long", [sys.executable, "-c", script], ready)],
        log_dir,
        lambda name, line: echoed.append(line),
    )
    await supervisor.start()
    [child] = supervisor.children
    assert child.pump is not None
    assert child.process is not None
    await asyncio.wait_for(child.pump, 30)
    assert await child.process.wait() == 0

    text = (log_dir / "long.log").read_text()
    assert text.count("x") == 300_000
    assert text.endswith("x\nafter\nthe end")
    assert echoed[-2:] == ["after", "the end"]


def crashing(restart_backoff: Backoff, echoed: list[str], log_dir: Path) -> Supervisor:
    async def ready() -> bool:
        return True

    spec = ProcessSpec("crashy", [sys.executable, "-c", "raise SystemExit(3)"], ready)
    return Supervisor(
        [spec], log_dir, lambda name, line: echoed.append(line), restart_backoff=restart_backoff
    )


async def test_a_process_that_dies_is_restarted_with_backoff(tmp_path: Path) -> None:
    echoed: list[str] = []
    supervisor = crashing(Backoff(0.1, 0.4, jitter=0.0), echoed, tmp_path / "logs")
    await supervisor.start()
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    await eventually(lambda: supervisor.children[0].restarts >= 4)
    stop.set()
    await running

    waits = [line.split("restarting in ")[1] for line in echoed if "restarting in" in line]
    assert waits[:4] == [
        "0.1s (restart #1)",
        "0.2s (restart #2)",
        "0.4s (restart #3)",
        "0.4s (restart #4)",
    ]
    assert all("crashy exited (code 3)" in line for line in echoed if "restarting in" in line)


async def test_a_stop_during_the_restart_backoff_ends_the_supervisor_at_once(
    tmp_path: Path,
) -> None:
    echoed: list[str] = []
    # an hour before the restart: the test passes only if stop cuts the wait short
    supervisor = crashing(Backoff(3600.0, 3600.0, jitter=0.0), echoed, tmp_path / "logs")
    await supervisor.start()
    stop = asyncio.Event()
    running = asyncio.create_task(supervisor.run(stop))
    await eventually(lambda: supervisor.children[0].restarts == 1)  # waiting to restart
    stop.set()
    await running
    assert supervisor.children[0].restarts == 1
    assert any("restarting in 3600.0s (restart #1)" in line for line in echoed)


def _marker(
    path: Path, name: str, ready: asyncio.Event | None = None, asked: list[bool] | None = None
) -> ProcessSpec:
    """A process that writes its name to ``path`` and waits for a signal; ready once
    ``ready`` is set (at once without one) and its file exists. Each answer of its ready
    check is appended to ``asked``."""

    async def check() -> bool:
        answer = (path / name).exists() and (ready is None or ready.is_set())
        if asked is not None:
            asked.append(answer)
        return answer

    script = f"import pathlib, signal; pathlib.Path({str(path / name)!r}).touch(); signal.pause()"
    return ProcessSpec(name, [sys.executable, "-c", script], check)


async def test_processes_start_side_by_side_each_after_those_it_names(tmp_path: Path) -> None:
    gate = asyncio.Event()  # "certmanager" is ready only when the test says so
    asked: list[bool] = []
    first = _marker(tmp_path, "certmanager", gate, asked)
    beside = _marker(tmp_path, "redis")
    after = _marker(tmp_path, "catalog")
    after.after = ("certmanager", "not-supervised")  # an unknown name is not waited for
    supervisor = Supervisor([first, after, beside], tmp_path / "logs", lambda *_: None)
    starting = asyncio.create_task(supervisor.start())
    try:
        await eventually(lambda: (tmp_path / "certmanager").exists())
        await eventually(lambda: (tmp_path / "redis").exists())  # not behind certmanager
        # certmanager's check has said "not ready" after its process was up: the catalog,
        # which comes after it, has not been started
        await eventually(lambda: asked.count(False) >= 2 and (tmp_path / "certmanager").exists())
        assert supervisor.children[1].process is None
        assert not (tmp_path / "catalog").exists()
        gate.set()
        await asyncio.wait_for(starting, 20)
        assert (tmp_path / "catalog").exists()
        assert all(child.ready for child in supervisor.children)
    finally:
        await supervisor.stop_all()


async def test_a_process_that_cannot_start_ends_the_others_waiting(tmp_path: Path) -> None:
    async def never() -> bool:
        return False

    broken = ProcessSpec("certmanager", [sys.executable, "-c", "raise SystemExit(3)"], never)
    waiting = _marker(tmp_path, "catalog")
    waiting.after = ("certmanager",)
    supervisor = Supervisor([broken, waiting], tmp_path / "logs", lambda *_: None)
    try:
        with pytest.raises(StartupError, match="certmanager exited with code 3"):
            await asyncio.wait_for(supervisor.start(), 20)
        assert not (tmp_path / "catalog").exists()
    finally:
        await supervisor.stop_all()
