"""``trellis spec``: validate mesh documents offline, list what the catalog has and why."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from trellis_catalog.domain import edge
from trellis_catalog.domain import spec as meshspec
from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import NEGATIVE
from trellis_common.documents import all_kinds
from trellis_common.specdir import load_paths

_STYLE = {"valid": "green", "warning": "yellow", "error": "red", "ignored": "magenta"}


def _rows(statuses: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            f"[{_STYLE.get(s['state'], 'white')}]{s['state']}[/]",
            s["key"],
            f"{s['source']}#{s['document']}" if s["source"] else "-",
            s["field"] or "-",
            s["reason"] or "-",
        )
        for s in statuses
    ]


@click.group(help="The mesh specification: SMI, ServiceEntry, Service, MeshConfig documents.")
def spec() -> None:
    pass


@spec.command(help="Check files or directories offline; exit 1 if any document has an error.")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def validate(paths: tuple[Path, ...], as_json: bool) -> None:
    documents, errors = load_paths(list(paths), all_kinds())
    built = meshspec.build(documents, errors)
    built.statuses.update(edge.egress_statuses(built, dict(built.statuses)))
    statuses = [asdict(s) for s in built.statuses.values()]
    statuses.sort(key=lambda s: (s["source"], s["document"]))
    failed = [s for s in statuses if s["state"] == "error"]
    if as_json:
        output.emit_json({"valid": not failed, "documents": statuses})
    else:
        shown = [s for s in statuses if s["state"] != "valid"]
        if shown:
            output.table(
                "Problems", ["STATE", "RESOURCE", "WHERE", "FIELD", "REASON"], _rows(shown)
            )
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(mesh: Mesh, state: str | None, as_json: bool) -> None:
    body = mesh.get_json("catalog", "/v1/resources", params={"state": state or ""})
    if as_json:
        output.emit_json(body)
        return
    source = body["source"]
    where = source.get("path") or source.get("kind")
    output.table(
        f"Mesh documents (from {where})",
        ["STATE", "RESOURCE", "WHERE", "FIELD", "REASON"],
        _rows(body["resources"]),
    )
