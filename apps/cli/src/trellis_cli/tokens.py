"""``trellis token``: onboarding tokens scoped to one identity (the injector keeps them).

An operator hands a token to whoever onboards one workload (``trellis vm bootstrap
--token-file F``, ``trellis vm register --token-file F``) instead of the admin token: it
onboards workloads of that namespace, service and service account only, ``--uses`` of them
(1 by default: one bootstrap and one registration), until it expires or is revoked. The
token is printed once, by ``create``; the mesh keeps only its digest.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from pathlib import Path

import click

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.proxyfolder import write_private

INJECTOR = "injector"
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h``, ``2d`` in seconds."""
    found = _DURATION.match(text.strip())
    if not found:
        raise click.BadParameter(f"{text!r}: expected a duration such as 30m, 1h or 2d")
    return float(found.group(1)) * _UNITS[found.group(2)]


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


@click.group(help="Onboarding tokens: onboard one service's workloads, not the mesh.")
def token() -> None:
    pass


@token.command(help="Make a token for one identity (needs the admin token); prints it once.")
@click.option("--namespace", "-n", required=True)
@click.option("--service", required=True, help="The one service whose workloads it onboards.")
@click.option(
    "--service-account", required=True, help="The service account those workloads run as."
)
@click.option("--ttl", default="1h", show_default=True, help="Lifetime: 30m, 1h, 2d (7d at most).")
@click.option(
    "--uses",
    type=click.IntRange(1, 1000),
    default=1,
    show_default=True,
    help="How many workloads it onboards (each: one bootstrap, one registration).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the token to this file (0600) instead of printing it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with the token).")
@click.pass_obj
def create(
    mesh: Mesh, namespace: str, service: str, service_account: str, ttl: str, uses: int,
    out: Path | None, as_json: bool,
) -> None:  # fmt: skip
    body = {
        "namespace": namespace,
        "service": service,
        "service_account": service_account,
        "ttl_seconds": parse_ttl(ttl),
        "uses": uses,
    }
    made = mesh.call(INJECTOR, "POST", "/v1/tokens", auth=True, json=body)
    if out is not None:
        write_private(out, made["token"] + "\n")
        made = {**made, "token": None, "token_file": str(out)}
    if as_json:
        output.emit_json(made)
        return
    output.errors.print(
        f"onboarding token {made['id']} for {namespace}/{service} (service account "
        f"{service_account}), {uses} workload(s), expires {_when(made['expires_at'])}"
    )
    if out is not None:
        output.errors.print(f"written to {out} (mode 0600)")
    else:
        click.echo(made["token"])


@token.command("list", help="Tokens not yet expired (what each is for; never a token).")
@output.format_option
@click.pass_obj
def list_(mesh: Mesh, fmt: output.Format) -> None:
    body = mesh.call(INJECTOR, "GET", "/v1/tokens", auth=True)
    if output.emit(fmt, body):
        return
    now = time.time()
    output.listing(
        fmt,
        "Onboarding tokens",
        [
            output.Column("ID", lambda t: t["id"]),
            output.Column("NAMESPACE", lambda t: t["namespace"]),
            output.Column("SERVICE", lambda t: t.get("service") or "(any)"),
            output.Column("SERVICE ACCOUNT", lambda t: t["service_account"]),
            output.Column("USES", lambda t: str(t.get("uses", 1))),
            output.Column("EXPIRES", lambda t: _when(t["expires_at"])),
            output.Column("LEFT", lambda t: f"{max(0.0, t['expires_at'] - now) / 60:.0f}m"),
            output.Column("CREATED", lambda t: output.when(t.get("created_at")), wide=True),
            output.Column("AGE", lambda t: output.age(t.get("created_at"), now), wide=True),
        ],
        body["tokens"],
    )


@token.command(help="Revoke a token by its id: it onboards nothing from now on.")
@click.argument("token_id")
@click.pass_obj
def revoke(mesh: Mesh, token_id: str) -> None:
    mesh.request(INJECTOR, "DELETE", f"/v1/tokens/{token_id}", auth=True)
    output.console.print(f"revoked onboarding token {token_id}")
