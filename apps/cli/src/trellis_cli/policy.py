"""``trellis policy check``: may this service account call that service, and why?"""

from __future__ import annotations

from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import NEGATIVE


def _route(route: dict[str, Any]) -> str:
    """One allowed route in a line: methods, path (exact, a segment prefix, or a regex),
    header matches (``~`` a regex, ``=`` exactly)."""
    methods = ",".join(route["methods"]) or "*"
    if route.get("path_exact"):
        path = route["path_exact"]
    elif route.get("path_prefix"):
        path = route["path_prefix"] + "[/...]"
    else:
        path = route["path_regex"]
    headers = [f"{k}~{v}" for k, v in route["headers"]]
    headers += [
        f"{h['name']}{'~' if h['regex'] else '='}{h['value']}"
        for h in route.get("header_matches", [])
    ]
    return " ".join([methods, path, *headers])


@click.group(help="Access policy as the catalog applies it.")
def policy() -> None:
    pass


@policy.command(
    help="Exit 0 if allowed, 1 if denied; prints the TrafficTargets, the routes, and what "
    "shapes the calls (Gateway API routes, TrafficSplit, Retry, UpstreamTrafficSetting)."
)
@click.option("--from", "source", required=True, metavar="NS/SA", help="Caller's service account.")
@click.option("--to", "destination", required=True, metavar="NS/SVC", help="Destination service.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def check(mesh: Mesh, source: str, destination: str, as_json: bool) -> None:
    body = mesh.get_json("catalog", "/v1/policy/check", params={"from": source, "to": destination})
    if as_json:
        output.emit_json(body)
    else:
        from rich.markup import escape  # only for people: --json never imports rich

        verdict = "[green]allowed[/]" if body["allowed"] else "[red]denied[/]"
        output.console.print(f"{source} -> {destination}: {verdict}: {escape(body['reason'])}")
        for route in body["routes"]:
            output.console.print(f"  route {escape(_route(route))}")
        for conflict in body.get("conflicts", []):
            output.console.print(f"  [yellow]conflict[/] {escape(conflict)}")
        for shaping in body.get("shaped_by", []):
            output.console.print(f"  shaped by {escape(shaping)}")
    if not body["allowed"]:
        raise SystemExit(NEGATIVE)
