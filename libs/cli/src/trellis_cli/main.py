"""The ``trellis`` command: run a local mesh, and inspect and operate a running one.

Exit codes (0 yes, 1 no, 2 no answer) are defined and enforced in :mod:`trellis_cli.errors`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import click

from trellis_cli import errors
from trellis_cli.certs import certs
from trellis_cli.client import Mesh
from trellis_cli.console import Echo
from trellis_cli.dst import dst
from trellis_cli.envoyrun import envoy
from trellis_cli.grpcworkload import grpc_group
from trellis_cli.identity import identity
from trellis_cli.inject import inject
from trellis_cli.policy import policy
from trellis_cli.proxy import proxy
from trellis_cli.spec import spec
from trellis_cli.status import status
from trellis_cli.supervisor import DEFAULT_LOG_BACKUPS, LogRotation, parse_size
from trellis_cli.tokens import token
from trellis_cli.up import up as run_up
from trellis_cli.vm import vm
from trellis_common import components, jointoken


@click.group(
    cls=errors.TrellisGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=errors.EPILOG,
)
@click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=lambda: os.environ.get("TRELLIS_STATE_DIR", ".trellis"),
    show_default=".trellis (or TRELLIS_STATE_DIR)",
    help="Where the running mesh keeps its token, addresses and data.",
)
@click.pass_context
def cli(ctx: click.Context, state_dir: Path) -> None:
    """Trellis: a service-mesh control plane."""
    ctx.obj = Mesh(state_dir)


@cli.command(
    help="Start Redis and the control plane as local processes (Ctrl-C stops them). The "
    "terminal shows what runs where, the demo's counters and the services' warnings and "
    "errors; every log line is in <state-dir>/logs/<name>.log. Exit 2 if it cannot start."
)
@click.option("--quiet", is_flag=True, help="Do not show the services' logs at all.")
@click.option("--verbose", "-v", is_flag=True, help="Show every line of the services' logs.")
@click.option(
    "--spec-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of mesh documents (YAML, subdirectories too) to watch [default: examples/ "
    "with the demo, else <state-dir>/spec].",
)
@click.option("--no-demo", is_flag=True, help="Only the control plane, no demo.")
@click.option(
    "--kubeconfig",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Also run endpoints-k8s against this cluster (an emulator's http:// server is "
    "fine); the catalog reads mesh documents there too, and the injector stores proxy "
    "Secrets there.",
)
@click.option(
    "--proxy-cp-replicas",
    type=click.IntRange(min=1, max=16),
    default=1,
    show_default=True,
    help="proxy-cp processes on the one xDS port (SO_REUSEPORT: the kernel spreads new "
    "proxy streams over them; one dying moves its proxies to the others).",
)
@click.option(
    "--state-dir",
    "up_state_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Same as `trellis --state-dir` (given here, it wins).",
)
@click.option(
    "--log-max-bytes",
    default="10MiB",
    show_default=True,
    help="Rotate each process's log in <state-dir>/logs once it reaches this size.",
)
@click.option(
    "--log-backups",
    type=click.IntRange(min=0),
    default=DEFAULT_LOG_BACKUPS,
    show_default=True,
    help="Rotated log files kept per process.",
)
@click.pass_obj
def up(
    mesh: Mesh,
    quiet: bool,
    verbose: bool,
    spec_dir: Path | None,
    no_demo: bool,
    kubeconfig: Path | None,
    proxy_cp_replicas: int,
    up_state_dir: Path | None,
    log_max_bytes: str,
    log_backups: int,
) -> None:
    state_dir = up_state_dir or mesh.state_dir
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose exclude each other")
    echo = Echo.QUIET if quiet else Echo.VERBOSE if verbose else Echo.WARNINGS
    try:
        rotation = LogRotation(parse_size(log_max_bytes), log_backups)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--log-max-bytes") from exc
    raise SystemExit(
        asyncio.run(
            run_up(
                state_dir,
                echo,
                spec_dir,
                with_demo=not no_demo,
                rotation=rotation,
                kubeconfig=kubeconfig.resolve() if kubeconfig else None,
                proxy_cp_replicas=proxy_cp_replicas,
            )
        )
    )


@cli.command("join-token")
@click.argument("component", type=click.Choice(components.COMPONENTS))
@click.option(
    "--ttl", type=click.IntRange(10, 3600), default=600, show_default=True, help="Seconds."
)
@click.pass_obj
def join_token(mesh: Mesh, component: str, ttl: int) -> None:
    """Leave a one-time join token for COMPONENT where it looks for one.

    `trellis up` does this before it starts each service; use it to start one by hand
    (with the same --state-dir). The service trades the token with certmanager for its
    certificate, and deletes the file.
    """
    try:
        path = jointoken.write_token(mesh.state_dir, component, ttl)
    except (OSError, jointoken.InvalidJoinToken) as exc:
        raise errors.CliError(f"cannot write a join token: {exc}") from exc
    click.echo(f"wrote {path} (mode 0600, valid {ttl} s, works once)")


cli.add_command(certs)
cli.add_command(identity)
cli.add_command(status)
cli.add_command(vm)
cli.add_command(spec)
cli.add_command(policy)
cli.add_command(dst)
cli.add_command(proxy)
cli.add_command(envoy)
cli.add_command(grpc_group)
cli.add_command(token)
cli.add_command(inject)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
