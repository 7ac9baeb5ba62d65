"""``trellis proxy``: the proxies connected to proxy-cp, the configuration each was sent, and
revoking a proxy's certificate.

``list`` and ``config`` read proxy-cp's admin API. ``revoke`` asks certmanager (admin token)
to revoke a proxy certificate, named by its common name or its proxy id (the UUID, looked
up among certmanager's proxy certificates): proxy-cp then ends the proxy's open xDS streams
within a second and refuses new ones. Per type, ``list`` shows whether the proxy ACKed
what it was sent: ``cds ✓`` (ACKed), ``rds NACK(2)`` (the latest was rejected; 2 NACKs on
this stream), ``eds sent`` (waiting for the ACK), ``lds -`` (asked for, nothing sent yet).
``config`` prints the resources as proxy-cp sent them, private keys already redacted by
proxy-cp (the admin API never returns a key). ``renew`` runs on a proxy's host and renews
its certificate through proxy-cp (:mod:`trellis_cli.renew`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import yaml

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import CliError, NotFound
from trellis_common.ids import InvalidIdentifier, ProxyCommonName, validate_proxy_id

SERVICE = "proxy-cp"
TYPES = ("cds", "eds", "lds", "rds", "sds")


@click.group(help="Proxies connected to proxy-cp and the configuration they were sent.")
def proxy() -> None:
    pass


def type_state(short: str, state: dict[str, Any]) -> str:
    """One type's state on one stream, e.g. ``cds ✓`` or ``rds NACK(2)``."""
    if state.get("last_error"):
        return f"{short} NACK({state.get('nacks', 0)})"
    sent = state.get("sent_version")
    if sent is None:
        return f"{short} -"
    if state.get("acked_version") == sent:
        return f"{short} ✓"
    return f"{short} sent"


def config_state(types: dict[str, dict[str, Any]]) -> str:
    known = [t for t in TYPES if t in types]
    others = sorted(t for t in types if t not in TYPES)
    return " ".join(type_state(t, types[t]) for t in [*known, *others]) or "-"


def last_error(proxy: dict[str, Any], refusals: dict[str, str]) -> str:
    """The proxy's NACK messages, else why its latest snapshot was refused, else ``-``."""
    errors = [
        f"{short}: {state['last_error']}"
        for short, state in sorted(proxy["types"].items())
        if state.get("last_error")
    ]
    refused = refusals.get(proxy.get("snapshot_key", ""), "")
    if refused:
        errors.append(f"snapshot refused: {refused}")
    return "; ".join(errors) or "-"


def _every_replica(mesh: Mesh, path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """``/v1/proxies`` of proxy-cp and of each replica (``trellis up --proxy-cp-replicas``),
    joined: each lists the proxies connected to it. Also which replica each proxy is
    connected to (``-o wide``), kept beside the answer so that its JSON stays proxy-cp's."""
    joined: dict[str, Any] = {"proxies": [], "groups": []}
    served_by: dict[str, str] = {}
    for index, name in enumerate(mesh.instances(SERVICE)):
        try:
            body = mesh.get_json(name, path)
        except (CliError, NotFound):
            if index == 0:
                raise
            continue  # a replica that went away: its proxies are reconnecting elsewhere
        joined["proxies"] += body.get("proxies", [])
        joined["groups"] += body.get("groups", [])
        served_by.update({p["proxy"]: name for p in body.get("proxies", [])})
    return joined, served_by


def _serving_replica(mesh: Mesh, path: str, **kwargs: Any) -> Any:
    """The answer of the proxy-cp replica the proxy is connected to (the others answer 404)."""
    first: click.ClickException | None = None
    for name in mesh.instances(SERVICE):
        try:
            return mesh.get_json(name, path, **kwargs)
        except (CliError, NotFound) as exc:  # not connected there (404), or gone
            first = first or exc
    assert first is not None
    raise first


@proxy.command("list", help="Connected proxies and, per type, whether they ACKed what was sent.")
@output.format_option
@click.pass_obj
def list_(mesh: Mesh, fmt: output.Format) -> None:
    body, served_by = _every_replica(mesh, "/v1/proxies")
    if output.emit(fmt, body):
        return
    refusals = {g["key"]: g["last_error"] for g in body.get("groups", []) if g.get("last_error")}
    proxies = body["proxies"]
    output.listing(
        fmt,
        f"Proxies connected to proxy-cp ({len(proxies)})",
        [
            output.Column("PROXY", lambda p: p["proxy"]),
            output.Column("IDENTITY", lambda p: p["identity"]),
            output.Column("PROTOCOL", lambda p: p["protocol"] or "-"),
            output.Column("ENVOY", lambda p: p["envoy_version"] or "-"),
            output.Column("CONFIG (ACKED/SENT)", lambda p: config_state(p["types"])),
            output.Column("LAST ERROR", lambda p: last_error(p, refusals)),
            output.Column("REPLICA", lambda p: served_by.get(p["proxy"], "-"), wide=True),
            output.Column("NODE ID", lambda p: p.get("node_id") or "-", wide=True),
            output.Column("CERT SERIAL", lambda p: (p.get("serial") or "-")[:16], wide=True),
            output.Column("AGE", lambda p: output.age(p.get("opened_at")), wide=True),
        ],
        proxies,
    )


@proxy.command(help="The configuration proxy-cp sent a proxy, as YAML (keys redacted).")
@click.argument("proxy_id")
@click.option(
    "--type",
    "types",
    type=click.Choice(TYPES),
    multiple=True,
    help="Only this type (repeatable) [default: all].",
)
@click.option("--json", "as_json", is_flag=True, help="Print proxy-cp's answer as JSON.")
@click.pass_obj
def config(mesh: Mesh, proxy_id: str, types: tuple[str, ...], as_json: bool) -> None:
    path = f"/v1/proxies/{quote(proxy_id, safe='')}/config"
    body = _serving_replica(mesh, path, params={"type": list(types)})
    if as_json:
        output.emit_json(body)
        return
    print(f"# proxy {body['proxy']}, snapshot version {body['version']}")
    print(yaml.safe_dump(body["resources"], sort_keys=False, allow_unicode=True), end="")


def proxy_common_name(mesh: Mesh, name: str) -> str:
    """The common name of the proxy certificate ``name`` designates (a common name, or a
    proxy id looked up among certmanager's proxy certificates)."""
    try:
        return ProxyCommonName.parse(name).format()
    except InvalidIdentifier:
        pass
    try:
        proxy_id = validate_proxy_id(name)
    except InvalidIdentifier as exc:
        raise CliError(
            f"{name!r} is neither a proxy's common name (<proxy-uuid>.<service>.<namespace>) "
            f"nor a proxy id (a UUID): {exc}"
        ) from None
    body = mesh.get_json("certmanager", "/v1/certificates", params={"kind": "proxy"})
    found = [c["common_name"] for c in body["certificates"] if c.get("proxy_id") == proxy_id]
    if not found:
        raise NotFound(f"no proxy certificate with proxy id {proxy_id} is on record")
    return str(found[0])


@proxy.command(help="Revoke a proxy's certificate (by common name or proxy id); admin token.")
@click.argument("proxy_name", metavar="COMMON_NAME_OR_PROXY_ID")
@click.option("--json", "as_json", is_flag=True, help="Print certmanager's answer as JSON.")
@click.pass_obj
def revoke(mesh: Mesh, proxy_name: str, as_json: bool) -> None:
    common_name = proxy_common_name(mesh, proxy_name)
    path = f"/v1/certificates/{quote(common_name, safe='')}/revoke"
    body = mesh.call("certmanager", "POST", path, auth=True)
    if as_json:
        output.emit_json(body)
        return
    output.console.print(
        f"revoked {body['common_name']}: serial {body['serial'][:16]} refused from now on "
        f"(revision {body['revision']}); onboard the proxy again to give it a new certificate"
    )


@proxy.command(
    help="Renew this proxy's certificate through proxy-cp (run it on the proxy's host): a new "
    "key is made here, only a CSR is sent, authenticated by the current certificate. Renews "
    "once 2/3 of the lifetime has passed, or now with --force; --watch keeps doing so (a VM "
    "agent). Envoy picks the new certificate up without a restart."
)
@click.option(
    "--dir",
    "folder",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The proxy's folder, as `trellis vm bootstrap --out` wrote it.",
)
@click.option("--force", is_flag=True, help="Renew now, however young the certificate.")
@click.option("--watch", is_flag=True, help="Keep renewing whenever due (runs until stopped).")
@click.option(
    "--server-name",
    default="",
    help="DNS name proxy-cp's certificate is checked for (default: <sa>.<namespace> of the "
    "bootstrap's proxy-cp identity).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def renew(folder: Path, force: bool, watch: bool, server_name: str, as_json: bool) -> None:
    from trellis_cli import renew as renewal  # gRPC and cryptography: `list` needs neither

    proxy_folder = renewal.ProxyFolder.load(folder.resolve(), server_name)
    if watch:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        renewal.watch(proxy_folder)
        return
    done = renewal.renew_if_due(proxy_folder, force)
    if done is None:
        due = renewal.renew_at(renewal.current_certificate(proxy_folder))
        if as_json:
            output.emit_json({"renewed": False, "renew_at": due.isoformat()})
        else:
            click.echo(f"not due: renews after {due.isoformat()} (--force to renew now)")
        return
    if as_json:
        output.emit_json(renewal.describe(done))
        return
    click.echo(
        f"renewed: serial {done.serial} (was {done.old_serial}), valid until "
        f"{done.not_after.isoformat()}; wrote {done.cert_chain}, {done.key} (mode 0600)"
    )
