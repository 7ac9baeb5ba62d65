"""``trellis identity``: the control plane's own certificates, and revoking them."""

from __future__ import annotations

import datetime as dt
from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import Mesh


@click.group(help="The control plane components' own certificates.")
def identity() -> None:
    pass


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat()[:19]


@identity.command("list", help="Who holds which component certificate; which are revoked.")
@output.format_option
@click.pass_obj
def list_(mesh: Mesh, fmt: output.Format) -> None:
    body: dict[str, Any] = mesh.get_json("certmanager", "/v1/identities")
    if output.emit(fmt, body):
        return
    revoked = {c["serial"]: c for c in body["revoked"]}
    output.listing(
        fmt,
        "Component certificates",
        [
            output.Column("COMPONENT", lambda c: c["component"]),
            output.Column("SERIAL", lambda c: c["serial"] if fmt == "wide" else c["serial"][:16]),
            output.Column("ISSUED", lambda c: _when(c["issued_at"])),
            output.Column("NOT AFTER", lambda c: _when(c["not_after"])),
            output.Column("REVOKED", lambda c: "yes" if c["serial"] in revoked else "-"),
            output.Column("AGE", lambda c: output.age(c["issued_at"]), wide=True),
            output.Column("ALSO NAMES", lambda c: ", ".join(c.get("also", [])) or "-", wide=True),
            output.Column(
                "REVOKED AT",
                lambda c: output.when(revoked.get(c["serial"], {}).get("revoked_at")),
                wide=True,
            ),
        ],
        body["issued"],
    )


@identity.command(
    help="Revoke every certificate of COMPONENT now (a leaked key): every service refuses "
    "it, and the component exits to join again with a new key. Needs the admin token."
)
@click.argument("component")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def revoke(mesh: Mesh, component: str, as_json: bool) -> None:
    body = mesh.call("certmanager", "POST", f"/v1/identities/{component}/revoke", auth=True)
    if as_json:
        output.emit_json(body)
        return
    serials = body["revoked"]
    if not serials:
        print(f"{component}: no unexpired certificate left to revoke")
        return
    print(f"revoked {len(serials)} certificate(s) of {component}: {', '.join(serials)}")
