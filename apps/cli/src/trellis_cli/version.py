"""``trellis version`` and ``trellis completion``.

``version`` prints the CLI's version and, for each component that answers, the version it
runs (its open ``/v1/status``); ``--client`` asks nothing. One version is the project's:
the chart's ``appVersion``, the image tag and every service's ``trellis_build_info``
(:mod:`trellis_common.version`).

``completion bash|zsh|fish`` prints the shell's completion script (click's), to source
from the shell's start-up file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from trellis_common import components
from trellis_common import version as project

if TYPE_CHECKING:
    from trellis_cli.client import Mesh

SHELLS = ("bash", "zsh", "fish")


def component_versions(mesh: Mesh) -> dict[str, dict[str, str]]:
    """Each component's (and replica's) answer: ``{"version": ...}`` or ``{"error": ...}``."""
    import httpx  # imported only when a component is asked: `--client` starts fast

    from trellis_common import statefile
    from trellis_runtime import adminhttp

    known = statefile.read_endpoints(mesh.state_dir)
    names = list(components.COMPONENTS)
    names += sorted(n for n in known if n not in names and n != "redis")
    found: dict[str, dict[str, str]] = {}
    for name in names:
        try:
            url = mesh.admin_url(name) + "/v1/status"
        except KeyError:
            continue  # a name with no default port and no endpoint recorded
        try:
            response = adminhttp.request(mesh.state_dir, name, "GET", url, timeout=2.0)
            body = response.json()
            found[name] = {"version": str(body.get("version") or "unknown (older than 0.2)")}
        except (httpx.HTTPError, ValueError, OSError) as exc:
            found[name] = {"error": f"unreachable ({type(exc).__name__}: {exc})"[:300]}
    return found


@click.command(help="The CLI's version and each running component's.")
@click.option("--client", "client_only", is_flag=True, help="Only the CLI's version.")
@click.option(
    "-o",
    "--output",
    "fmt",
    type=click.Choice(["text", "json", "yaml"]),
    default="text",
    show_default=True,
)
@click.pass_obj
def version(mesh: Mesh, client_only: bool, fmt: str) -> None:
    body: dict[str, Any] = {"client": {"version": project.version()}}
    if not client_only:
        body["components"] = component_versions(mesh)
    if fmt == "json":
        from trellis_cli import output

        output.emit_json(body)
        return
    if fmt == "yaml":
        import yaml

        click.echo(yaml.safe_dump(body, sort_keys=False), nl=False)
        return
    click.echo(f"client: {body['client']['version']}")
    for name, answer in body.get("components", {}).items():
        click.echo(f"{name}: {answer.get('version') or answer.get('error')}")


@click.command(
    help="Print the shell completion script (bash, zsh or fish).",
    epilog="Load it with `source <(trellis completion bash)`, "
    '`trellis completion zsh > "${fpath[1]}/_trellis"`, or '
    "`trellis completion fish > ~/.config/fish/completions/trellis.fish`.",
)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    from click.shell_completion import get_completion_class

    root = ctx.find_root().command
    made = get_completion_class(shell)
    assert made is not None  # every shell of SHELLS is one of click's
    click.echo(made(root, {}, "trellis", "_TRELLIS_COMPLETE").source())
