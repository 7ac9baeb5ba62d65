"""What of the supervised processes' output ``trellis up`` shows on the terminal.

Every line a process writes goes to its log file under ``<state-dir>/logs`` (the
supervisor does that); the terminal is a summary. By default it shows a child's line only
if its level is WARNING or above, read from the line itself: Trellis' key=value format
(``level=warning``), its JSON format (``"level":"warning"``) and Envoy's
(``[...][warning][config] ...``). A line with no level that we can read (a traceback written
to stderr, a Redis warning, a program's own ``print``) is shown: hiding a crash to keep the
terminal tidy would be the wrong trade. ``--verbose`` shows every line, ``--quiet`` none;
the supervisor's own lines (``trellis``: restarts, readiness) are always shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum

from rich.markup import escape

from trellis_cli import output

SUPERVISOR = "trellis"
COLORS = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan")

_LEVEL = re.compile(
    r"(?:^|\s)level=(?P<kv>\w+)"  # key=value
    r'|"level"\s*:\s*"(?P<json>\w+)"'  # JSON
    r"|^\[[^\]]*\]\[[^\]]*\]\[(?P<envoy>\w+)\]"  # Envoy: [time][thread][level][logger]
)
_QUIET_LEVELS = frozenset({"trace", "debug", "info", "notice"})


class Echo(Enum):
    QUIET = "quiet"  # the supervisor's own lines only
    WARNINGS = "warnings"  # ... and the children's warnings, errors and unlevelled lines
    VERBOSE = "verbose"  # everything


def level_of(line: str) -> str | None:
    """The level a log line declares, lower case, or ``None``."""
    match = _LEVEL.search(line)
    if match is None:
        return None
    return (match.group("kv") or match.group("json") or match.group("envoy")).lower()


def shown(mode: Echo, name: str, line: str) -> bool:
    if name == SUPERVISOR or mode is Echo.VERBOSE:
        return True
    if mode is Echo.QUIET:
        return False
    return level_of(line) not in _QUIET_LEVELS


def make_echo(mode: Echo) -> Callable[[str, str], None]:
    """The supervisor's ``echo``: shown lines, prefixed by the process's name in a color."""
    colors: dict[str, str] = {}

    def echo(name: str, line: str) -> None:
        if not shown(mode, name, line):
            return
        color = colors.setdefault(name, COLORS[len(colors) % len(COLORS)])
        output.console.print(
            f"[{color}]{name:>12}[/] | {escape(line)}", highlight=False, soft_wrap=True
        )

    return echo
