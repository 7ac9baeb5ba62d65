"""The ``trellis`` command: run a local mesh, and inspect and operate a running one.

Exit codes (0 yes, 1 no, 2 no answer) are defined and enforced in :mod:`trellis_cli.errors`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from trellis_cli import errors
from trellis_cli.lazy import LazyCommand, LazyGroup
from trellis_common import components
from trellis_identity import jointoken

if TYPE_CHECKING:
    from trellis_cli.client import Mesh
    from trellis_cli.cluster import Target

#: The subcommands, imported when run (:mod:`trellis_cli.lazy`), with the help ``--help`` lists.
COMMANDS = {
    "certs": LazyCommand("trellis_cli.certs:certs", "The mesh CA and the certificates it issued."),
    "check": LazyCommand(
        "trellis_cli.check:check",
        "Check the control plane (as `linkerd check`): one line per check; exit 1 if any fails.",
    ),
    "completion": LazyCommand(
        "trellis_cli.version:completion",
        "Print the shell completion script (bash, zsh or fish).",
    ),
    "dashboard": LazyCommand(
        "trellis_cli.dashboard:dashboard",
        "A live picture of the mesh in the browser: services, the traffic between them "
        "(rate, success, latency, mTLS), policies and rejected documents. Serves it on "
        "127.0.0.1 with the CLI's credentials, as `istioctl dashboard` does; Ctrl-C stops it.",
    ),
    "dst": LazyCommand(
        "trellis_cli.dst:dst", "The Linkerd Destination API as proxy-cp serves it (port 8086)."
    ),
    "envoy": LazyCommand(
        "trellis_cli.envoyrun:envoy", "The Envoy binary installed by `make bootstrap`."
    ),
    "gateway": LazyCommand(
        "trellis_cli.gateway:gateway", "Gateway API Gateways served by a Trellis gateway Envoy."
    ),
    "grpc": LazyCommand(
        "trellis_cli.grpcworkload:grpc_group",
        "Proxyless gRPC workloads: bootstrap files and their agent.",
    ),
    "identity": LazyCommand(
        "trellis_cli.identity:identity", "The control plane components' own certificates."
    ),
    "inject": LazyCommand("trellis_cli.inject:inject", "Sidecar injection on Kubernetes."),
    "policy": LazyCommand("trellis_cli.policy:policy", "Access policy as the catalog applies it."),
    "proxy": LazyCommand(
        "trellis_cli.proxy:proxy",
        "Proxies connected to proxy-cp and the configuration they were sent.",
    ),
    "spec": LazyCommand(
        "trellis_cli.spec:spec",
        "The mesh specification: SMI, ServiceEntry, Service, MeshConfig documents.",
    ),
    "status": LazyCommand(
        "trellis_cli.status:status",
        "Health of each service of the running mesh; exit 1 if any is unhealthy, 2 if none "
        "answers (the mesh is not running).",
    ),
    "token": LazyCommand(
        "trellis_cli.tokens:token",
        "Onboarding tokens: onboard one service's workloads, not the mesh.",
    ),
    "up": LazyCommand(
        "trellis_cli.up:command",
        "Start Redis and the control plane as local processes (Ctrl-C stops them).",
    ),
    "version": LazyCommand(
        "trellis_cli.version:version",
        "The CLI's version and each running component's.",
    ),
    "vm": LazyCommand(
        "trellis_cli.vm:vm",
        "Workloads outside Kubernetes (VMs, machines): the endpoints-vm registry.",
    ),
}


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
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
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path),
    default=None,
    help="Reach the control plane in this cluster (default: KUBECONFIG or ~/.kube/config, "
    "when there is no local mesh).",
)
@click.option("--context", default=None, help="The kubeconfig's context to use (a cluster).")
@click.option(
    "-n",
    "--control-plane-namespace",
    default="trellis-system",
    show_default=True,
    help="The control plane's namespace in the cluster.",
)
@click.pass_context
def cli(
    ctx: click.Context,
    state_dir: Path,
    kubeconfig: Path | None,
    context: str | None,
    control_plane_namespace: str,
) -> None:
    """Trellis: a service-mesh control plane."""
    cluster = ctx.invoked_subcommand in CLUSTER_COMMANDS
    if not cluster and (kubeconfig is not None or context is not None):
        raise click.UsageError(
            f"--kubeconfig and --context apply to {', '.join(sorted(CLUSTER_COMMANDS))}; "
            f"`trellis {ctx.invoked_subcommand}` works on the local mesh (--state-dir)"
        )
    options = (kubeconfig, context, control_plane_namespace) if cluster else None
    # `version` prints the client's version whatever answers: with no mesh anywhere, the
    # components are unreachable locally, not an error
    ctx.obj = MeshOnDemand(state_dir, options, lenient=ctx.invoked_subcommand == "version")
    ctx.call_on_close(ctx.obj.close)


#: The commands that reach a control plane in a cluster as well as a local one
#: (:mod:`trellis_cli.cluster`); the others work on the local mesh only.
CLUSTER_COMMANDS = frozenset(
    {"certs", "check", "dashboard", "identity", "policy", "proxy", "spec", "status", "version"}
)


class MeshOnDemand:
    """The commands' :class:`~trellis_cli.client.Mesh`, made when one first uses it: a
    command that asks nothing of the mesh (``--help``, ``version --client``,
    ``completion``) never imports the HTTP client and its TLS stack (a third of a second),
    nor the Kubernetes client. ``cluster``: the cluster options of a command that can reach
    a cluster (:func:`trellis_cli.cluster.resolve` picks the local mesh or a cluster)."""

    def __init__(
        self,
        state_dir: Path,
        cluster: tuple[Path | None, str | None, str] | None = None,
        lenient: bool = False,
    ) -> None:
        self._state_dir = state_dir
        self._cluster = cluster
        self._lenient = lenient
        self._mesh: Mesh | None = None

    def target(self) -> Target | None:
        """The cluster the command reaches, or None for the local mesh."""
        if self._cluster is None:
            return None
        from trellis_cli import cluster

        try:
            return cluster.resolve(self._state_dir, *self._cluster)
        except errors.CliError:
            if self._lenient and self._cluster[:2] == (None, None):
                return None  # nothing found, nothing asked for: the local mesh (silent)
            raise

    def resolved(self) -> Mesh:
        if self._mesh is None:
            target = self.target()
            if target is None:
                from trellis_cli.client import Mesh

                self._mesh = Mesh(self._state_dir)
            else:
                from trellis_cli import cluster

                self._mesh = cluster.connect(target)
        return self._mesh

    def close(self) -> None:
        """At the command's end: a cluster's connections and tunnels (a local mesh holds
        none open)."""
        cluster = getattr(self._mesh, "cluster", None)
        if cluster is not None:
            cluster.close()

    def __getattr__(self, name: str) -> object:
        return getattr(self.resolved(), name)


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


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
