"""``trellis up``'s terminal: a summary (warnings and errors), every line in the log files."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from rich.console import Console

from trellis_cli import output
from trellis_cli.console import Echo, level_of, make_echo
from trellis_cli.supervisor import ProcessSpec, Supervisor

INFO_KV = "ts=2025-01-01T00:00:00.000Z level=info logger=trellis service.starting service=catalog"
WARNING_KV = "ts=2025-01-01T00:00:00.000Z level=warning logger=trellis loop.down loop=redis"
ERROR_KV = "ts=2025-01-01T00:00:00.000Z level=error logger=trellis record.rejected key=a/b"
INFO_JSON = '{"ts":1.0,"level":"info","logger":"trellis","event":"x","msg":"x"}'
WARNING_JSON = '{"ts":1.0,"level":"warning","logger":"trellis","event":"y","msg":"y"}'
INFO_ENVOY = "[2025-01-01 00:00:00.000][12][info][main] [source/server/server.cc:1] starting"
WARNING_ENVOY = "[2025-01-01 00:00:00.000][12][warning][config] gRPC config stream closed"
TRACEBACK = "Traceback (most recent call last):"

LINES = [INFO_KV, WARNING_KV, ERROR_KV, INFO_JSON, WARNING_JSON, INFO_ENVOY, WARNING_ENVOY]
LINES.append(TRACEBACK)
SHOWN = [WARNING_KV, ERROR_KV, WARNING_JSON, WARNING_ENVOY, TRACEBACK]


@pytest.mark.parametrize(
    ("line", "level"),
    [
        (INFO_KV, "info"),
        (WARNING_KV, "warning"),
        (INFO_JSON, "info"),
        (WARNING_JSON, "warning"),
        (INFO_ENVOY, "info"),
        (WARNING_ENVOY, "warning"),
        (TRACEBACK, None),
        ("12345:M 01 Jan 2025 00:00:00.000 # WARNING overcommit_memory", None),
    ],
)
def test_level_of(line: str, level: str | None) -> None:
    assert level_of(line) == level


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    screen = io.StringIO()
    monkeypatch.setattr(output, "console", Console(file=screen, width=400, no_color=True))
    return screen


async def run_child(log_dir: Path, mode: Echo) -> None:
    """A real process printing every kind of line, supervised with ``mode``'s echo."""

    async def ready() -> bool:
        return True

    # It prints, closes its output, and exits only once the supervisor has started it: a
    # child that exits first is, rightly, a start-up failure (seen under load).
    go = log_dir.parent / "go"
    script = (
        "import os, sys, time\n"
        f"sys.stdout.write({chr(10).join(LINES) + chr(10)!r})\n"
        "sys.stdout.flush(); os.close(1)\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
    )
    supervisor = Supervisor(
        [ProcessSpec("catalog", [sys.executable, "-c", script], ready)], log_dir, make_echo(mode)
    )
    await supervisor.start()
    go.touch()
    [child] = supervisor.children
    assert child.pump is not None
    assert child.process is not None
    await child.pump
    assert await child.process.wait() == 0
    assert (log_dir / "catalog.log").read_text().splitlines() == LINES  # the file has it all


def shown(screen: io.StringIO) -> list[str]:
    return [line.split(" | ", 1)[1] for line in screen.getvalue().splitlines()]


async def test_by_default_only_warnings_errors_and_unlevelled_lines_reach_the_terminal(
    tmp_path: Path, terminal: io.StringIO
) -> None:
    await run_child(tmp_path / "logs", Echo.WARNINGS)

    assert shown(terminal) == SHOWN
    assert all(line.startswith("     catalog | ") for line in terminal.getvalue().splitlines())


async def test_verbose_shows_every_line(tmp_path: Path, terminal: io.StringIO) -> None:
    await run_child(tmp_path / "logs", Echo.VERBOSE)

    assert shown(terminal) == LINES


async def test_quiet_shows_none_of_the_childrens_lines(
    tmp_path: Path, terminal: io.StringIO
) -> None:
    await run_child(tmp_path / "logs", Echo.QUIET)

    assert terminal.getvalue() == ""


def test_the_supervisors_own_lines_are_always_shown(terminal: io.StringIO) -> None:
    make_echo(Echo.QUIET)("trellis", "catalog exited (code 1) after 0.2s; restarting in 0.5s")

    assert shown(terminal) == ["catalog exited (code 1) after 0.2s; restarting in 0.5s"]
