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
@output.format_option
@click.pass_obj
def list_(mesh: Mesh, kind: str | None, namespace: str, fmt: output.Format) -> None:
    params: dict[str, Any] = {"namespace": namespace}
    if kind:
        params["kind"] = kind
    body = mesh.get_json("certmanager", "/v1/certificates", params=params)
    if output.emit(fmt, body):
        return
    wide = fmt == "wide"  # the whole serial, where the table shows its first 16 digits
    output.listing(
        fmt,
        f"Certificates (revision {body['revision']})",
        [
            output.Column("COMMON NAME", lambda c: c["common_name"]),
            output.Column("KIND", lambda c: c["kind"]),
            output.Column("SERIAL", lambda c: c["serial"] if wide else c["serial"][:16]),
            output.Column("NOT AFTER", lambda c: c["not_after"][:19]),
            output.Column("RENEW AFTER", lambda c: c["renew_after"][:19]),
            output.Column("SPIFFE ID", lambda c: ", ".join(c["uris"]) or "-"),
            output.Column("NOT BEFORE", lambda c: c["not_before"][:19], wide=True),
            output.Column("AGE", lambda c: output.age(c.get("not_before")), wide=True),
            output.Column(
                "DNS NAMES", lambda c: ", ".join(c.get("dns_names", [])) or "-", wide=True
            ),
            output.Column("PROXY ID", lambda c: c.get("proxy_id") or "-", wide=True),
            output.Column("ISSUER", lambda c: c.get("issuer") or "-", wide=True),
            output.Column(
                "SHA-256", lambda c: (c.get("fingerprint_sha256") or "-")[:16], wide=True
            ),
        ],
        body["certificates"],
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
