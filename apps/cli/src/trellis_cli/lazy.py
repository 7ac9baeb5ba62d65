"""Subcommands imported when they run, not when ``trellis`` starts.

Every subcommand pulls its own dependencies in: gRPC and the Envoy API types (``dst``,
``grpc``), the Kubernetes client (``inject``), the supervisor and the demo (``up``). Imported
all at once, ``trellis --help`` took 4 s, and so did every ``trellis vm heartbeat``. A
:class:`LazyGroup` knows each subcommand by the module that defines it and the one-line help
``--help`` lists, and imports the module only when that subcommand is run (or its own
``--help`` is asked for). The listed help is checked against the real command's by the tests,
so the two cannot drift apart.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from trellis_cli.errors import TrellisGroup


@dataclass(frozen=True)
class LazyCommand:
    """A subcommand: ``module:attribute`` of the click command, and its listed help."""

    target: str
    help: str

    def load(self) -> click.Command:
        module, _, attribute = self.target.partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.target} is not a click command")
        return command


class LazyGroup(TrellisGroup):
    """A :class:`~trellis_cli.errors.TrellisGroup` whose ``lazy`` subcommands are imported on
    first use."""

    def __init__(self, *args: Any, lazy: Mapping[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in self.lazy:
            found = self.lazy[cmd_name].load()
            self.add_command(found, cmd_name)
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The command list of ``--help``, as click writes it, from the listed help: no
        subcommand is imported for it."""
        names = [
            name
            for name in self.list_commands(ctx)
            if name in self.lazy or not self.commands[name].hidden
        ]
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, self.listed_help(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def listed_help(self, name: str, limit: int) -> str:
        """The one line ``--help`` lists for the subcommand ``name``."""
        command = self.commands.get(name)
        if command is not None:
            return command.get_short_help_str(limit)
        # click shortens a command's help the same way, whether it is imported or not
        return click.Command(name, help=self.lazy[name].help).get_short_help_str(limit)
