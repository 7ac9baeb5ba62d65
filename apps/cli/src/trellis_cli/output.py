"""Printing results: rich tables for people, JSON and YAML for scripts.

Every command that lists takes the same ``-o/--output`` (:func:`format_option`), as
kubectl, istioctl and linkerd do: ``table`` (the default), ``wide`` (the table with the
columns a plain terminal has no room for: addresses, serials, ages, identities), ``json``
and ``yaml``. ``--json`` stays as the older spelling of ``-o json``: scripts, tests and the
docs use it. JSON and YAML print the service's answer as it came, the same data whatever the
format, so a script can switch from one to the other; only the table shapes it for people.
:func:`emit` prints the two machine formats and :func:`listing` the two tables.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import click

if TYPE_CHECKING:
    from rich.console import Console

console: Console  # made on first use (below): `-o json` and scripts never import rich
errors: Console


@functools.cache
def _console(stderr: bool) -> Console:
    from rich.console import Console

    # Piped output is read by people through `less` or by grep: never cut a cell short there.
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr) if tty else Console(stderr=stderr, width=240)


def __getattr__(name: str) -> Console:
    """``console`` and ``errors``, the rich consoles of stdout and stderr, made when a
    command first prints a table or coloured text (rich takes a tenth of a second to
    import, paid by every ``trellis`` run otherwise)."""
    if name == "console":
        return _console(False)
    if name == "errors":
        return _console(True)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


Format = Literal["table", "wide", "json", "yaml"]
FORMATS: tuple[Format, ...] = ("table", "wide", "json", "yaml")


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def emit_yaml(data: Any) -> None:
    """``data`` as YAML: the very values ``--json`` prints (through the same conversion, so
    a timestamp or a tuple reads the same in both), keys sorted as in JSON."""
    import yaml  # only a YAML listing pays for it

    plain = json.loads(json.dumps(data, default=str))
    print(yaml.safe_dump(plain, sort_keys=True, allow_unicode=True), end="")


def emit(fmt: Format, data: Any) -> bool:
    """Print ``data`` if ``fmt`` is a machine format (``json``, ``yaml``); ``True`` if it
    did, so a command can ``return`` and leave the table formats to itself."""
    if fmt == "json":
        emit_json(data)
        return True
    if fmt == "yaml":
        emit_yaml(data)
        return True
    return False


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.table import Table

    out = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*(str(cell) for cell in row))
    stdout: Console | None = globals().get("console")  # set when a test puts its own
    (stdout or _console(False)).print(out)


@dataclass(frozen=True)
class Column:
    """One column of a listing: its header, how a row's item gives its cell, and whether
    only ``-o wide`` shows it."""

    header: str
    cell: Callable[[Any], object]
    wide: bool = False


def shown(fmt: Format, columns: Sequence[Column]) -> list[Column]:
    return [c for c in columns if fmt == "wide" or not c.wide]


def listing(fmt: Format, title: str, columns: Sequence[Column], items: Sequence[Any]) -> None:
    """A table of ``items`` with the ``columns`` that ``fmt`` (``table`` or ``wide``) shows.
    A command prints JSON and YAML with :func:`emit` first, before it reads the answer, so
    that those print whatever the service said, as they always have."""
    picked = shown(fmt, columns)
    table(title, [c.header for c in picked], [[c.cell(item) for c in picked] for item in items])


def format_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``-o/--output table|wide|json|yaml`` and ``--json`` (the same as ``-o json``) on a
    command, which receives the chosen :data:`Format` as its ``fmt`` argument.

    Two options, joined here rather than sharing one destination: click lets the last of
    several options with one name win, which would let ``-o wide --json`` quietly print
    one of them; here that is a usage error naming both."""

    @functools.wraps(command)
    def joined(*args: Any, output_format: str | None, as_json: bool, **kwargs: Any) -> Any:
        if as_json and output_format not in (None, "json"):
            raise click.UsageError(
                f"--json is the same as -o json; it cannot go with -o {output_format}"
            )
        fmt = "json" if as_json else (output_format or "table")
        return command(*args, fmt=cast(Format, fmt), **kwargs)

    with_json = click.option(
        "--json", "as_json", is_flag=True, help="The same as -o json (kept for scripts)."
    )(joined)
    return click.option(
        "-o",
        "--output",
        "output_format",
        type=click.Choice(FORMATS),
        default=None,
        metavar="|".join(FORMATS),
        help="table (the default), wide (more columns), json or yaml (the service's answer).",
    )(with_json)


def when(epoch: float | None) -> str:
    """An epoch as an ISO time to the second in UTC, ``-`` for none."""
    if not epoch:
        return "-"
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


def age(since: float | str | None, now: float | None = None) -> str:
    """How long ago ``since`` (an epoch or an ISO time) was, as kubectl's AGE reads:
    ``45s``, ``12m``, ``3h``, ``2d`` (a unit once there are two of it); ``-`` when unknown."""
    if since in (None, "", 0):
        return "-"
    if isinstance(since, str):
        try:
            since = dt.datetime.fromisoformat(since).timestamp()
        except ValueError:
            return "-"
    return span((time.time() if now is None else now) - since)


def span(seconds: float) -> str:
    """A length of time as :func:`age` writes it: ``45s``, ``12m``, ``3h``, ``2d``."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:.0f}s"
