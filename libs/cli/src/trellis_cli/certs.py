"""``trellis certs``: list certificates, show the root, rotate on demand."""

from __future__ import annotations

from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import Mesh


@click.group(help="The mesh CA and the certificates it issued.")
def certs() -> None:
    pass


@certs.command("list", help="Certificates on record (metadata only; keys never leave).")
@click.option("--kind", type=click.Choice(["service", "proxy"]), help="Only this kind.")
@click.option("--namespace", "-n", default="", help="Only this namespace.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(mesh: Mesh, kind: str | None, namespace: str, as_json: bool) -> None:
    params: dict[str, Any] = {"namespace": namespace}
    if kind:
        params["kind"] = kind
    body = mesh.get_json("certmanager", "/v1/certificates", params=params)
    if as_json:
        output.emit_json(body)
        return
    output.table(
        f"Certificates (revision {body['revision']})",
        ["COMMON NAME", "KIND", "SERIAL", "NOT AFTER", "RENEW AFTER", "SPIFFE ID"],
        [
            (
                c["common_name"],
                c["kind"],
                c["serial"][:16],
                c["not_after"][:19],
                c["renew_after"][:19],
                ", ".join(c["uris"]) or "-",
            )
            for c in body["certificates"]
        ],
    )


@certs.command(help="The trust bundle (PEM) proxies verify peers against.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON with fingerprint and expiry.")
@click.pass_obj
def root(mesh: Mesh, as_json: bool) -> None:
    body = mesh.get_json("certmanager", "/v1/root")
    if as_json:
        output.emit_json(body)
        return
    output.errors.print(
        f"# {body['subject']} ({body['origin']}), sha256 {body['fingerprint_sha256']}, "
        f"expires {body['not_after']}"
    )
    print(body["trust_bundle_pem"], end="")


@certs.command(help="Re-issue a certificate now (new key and serial); needs the admin token.")
@click.argument("common_name")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def rotate(mesh: Mesh, common_name: str, as_json: bool) -> None:
    body = mesh.call("certmanager", "POST", f"/v1/certificates/{common_name}/rotate", auth=True)
    if as_json:
        output.emit_json(body)
        return
    cert = body["certificate"]
    output.console.print(
        f"rotated {cert['common_name']}: serial {cert['serial'][:16]}, "
        f"valid until {cert['not_after'][:19]} (revision {body['revision']})"
    )
