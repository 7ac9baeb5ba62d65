"""``trellis spec``: validate mesh documents offline, list what the catalog has and why."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import NEGATIVE

_STYLE = {"valid": "green", "warning": "yellow", "error": "red", "ignored": "magenta"}


def _conditions(conditions: list[dict[str, Any]] | None) -> str:
    return ",".join(f"{c.get('type', '?')}={c.get('status', '?')}" for c in conditions or [])


def _parents(status: dict[str, Any]) -> str:
    """A Gateway API route's parents, each with its conditions: ``bookstore/bookstore:
    Accepted=True``; a GatewayClass's or Gateway's own conditions, and a Gateway's
    listeners with the routes attached to each; ``-`` for a document that has none."""
    parents = []
    for parent in status.get("parents") or []:
        port = f":{parent['port']}" if parent.get("port") else ""
        section = f"/{parent['section_name']}" if parent.get("section_name") else ""
        conditions = _conditions(parent.get("conditions"))
        where = f"{parent['kind']} " if parent.get("kind") == "Gateway" else ""
        parents.append(
            f"{where}{parent['namespace']}/{parent['name']}{section}{port} {conditions}".strip()
        )
    if status.get("conditions"):
        parents.append(_conditions(status["conditions"]))
    for listener in status.get("listeners") or []:
        parents.append(
            f"{listener['name']} ({listener['attached_routes']} routes) "
            f"{_conditions(listener.get('conditions'))}"
        )
    return "; ".join(parents) or "-"


#: The columns of a document's status; ``-o wide`` adds where it is from and its parents.
COLUMNS = [
    output.Column("STATE", lambda s: f"[{_STYLE.get(s['state'], 'white')}]{s['state']}[/]"),
    output.Column("RESOURCE", lambda s: s["key"]),
    output.Column("WHERE", lambda s: f"{s['source']}#{s['document']}" if s["source"] else "-"),
    output.Column("FIELD", lambda s: s["field"] or "-"),
    output.Column("REASON", lambda s: s["reason"] or "-"),
    output.Column("API VERSION", lambda s: s.get("api_version") or "-", wide=True),
    output.Column("PARENTS", _parents, wide=True),
]


@click.group(help="The mesh specification: SMI, ServiceEntry, Service, MeshConfig documents.")
def spec() -> None:
    pass


@spec.command(help="Check files or directories offline; exit 1 if any document has an error.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@output.format_option
def validate(paths: tuple[Path, ...], fmt: output.Format) -> None:
    # the mesh specification's model and validation, as the catalog applies them
    # (pydantic, a second of imports): only here, `spec list` is one request
    from trellis_common.documents import all_kinds
    from trellis_common.specdir import load_paths
    from trellis_spec import egress
    from trellis_spec import mesh as meshspec

    documents, errors = load_paths(list(paths), all_kinds())
    built = meshspec.build(documents, errors)
    built.statuses.update(egress.egress_statuses(built, dict(built.statuses)))
    statuses = [asdict(s) for s in built.statuses.values()]
    statuses.sort(key=lambda s: (s["source"], s["document"]))
    failed = [s for s in statuses if s["state"] == "error"]
    if not output.emit(fmt, {"valid": not failed, "documents": statuses}):
        shown = [s for s in statuses if s["state"] != "valid"]
        if shown:
            output.listing(fmt, "Problems", COLUMNS, shown)
        counts = {state: sum(1 for s in statuses if s["state"] == state) for state in _STYLE}
        output.console.print(
            f"{len(statuses)} documents: {counts['valid']} valid, {counts['warning']} with "
            f"warnings, {counts['error']} with errors, {counts['ignored']} ignored (a kind no "
            "Trellis service reads)"
        )
    if failed:
        raise SystemExit(NEGATIVE)


@spec.command("list", help="What the running catalog has read, with each document's status.")
@click.option(
    "--state",
    type=click.Choice(["valid", "warning", "error", "ignored"]),
    help="Only this status.",
)
@output.format_option
@click.pass_obj
def list_(mesh: Mesh, state: str | None, fmt: output.Format) -> None:
    body = mesh.get_json("catalog", "/v1/resources", params={"state": state or ""})
    if output.emit(fmt, body):
        return
    source = body["source"]
    where = source.get("path") or source.get("kind")
    output.listing(fmt, f"Mesh documents (from {where})", COLUMNS, body["resources"])
