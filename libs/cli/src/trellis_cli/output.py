"""Printing results: rich tables for people, ``--json`` for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

# Piped output is read by people through `less` or by grep: never cut a cell short there.
console = Console() if sys.stdout.isatty() else Console(width=240)
errors = Console(stderr=True) if sys.stderr.isatty() else Console(stderr=True, width=240)


def emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str))


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    out = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        out.add_column(column, overflow="fold")
    for row in rows:
        out.add_row(*(str(cell) for cell in row))
    console.print(out)
