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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(mesh: Mesh, as_json: bool) -> None:
    body: dict[str, Any] = mesh.get_json("certmanager", "/v1/identities")
    if as_json:
        output.emit_json(body)
        return
    revoked = {c["serial"] for c in body["revoked"]}
    output.table(
        "Component certificates",
        ["COMPONENT", "SERIAL", "ISSUED", "NOT AFTER", "REVOKED"],
        [
            (
                c["component"],
                c["serial"][:16],
                _when(c["issued_at"]),
                _when(c["not_after"]),
                "yes" if c["serial"] in revoked else "-",
            )
            for c in body["issued"]
        ],
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
