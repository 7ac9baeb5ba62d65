"""``trellis policy check``: may this service account call that service, and why?"""

from __future__ import annotations

import click

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.errors import NEGATIVE


@click.group(help="Access policy as the catalog applies it.")
def policy() -> None:
    pass


@policy.command(help="Exit 0 if allowed, 1 if denied; prints the TrafficTargets and routes.")
@click.option("--from", "source", required=True, metavar="NS/SA", help="Caller's service account.")
@click.option("--to", "destination", required=True, metavar="NS/SVC", help="Destination service.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def check(mesh: Mesh, source: str, destination: str, as_json: bool) -> None:
    body = mesh.get_json("catalog", "/v1/policy/check", params={"from": source, "to": destination})
    if as_json:
        output.emit_json(body)
    else:
        verdict = "[green]allowed[/]" if body["allowed"] else "[red]denied[/]"
        output.console.print(f"{source} -> {destination}: {verdict}: {body['reason']}")
        for route in body["routes"]:
            methods = ",".join(route["methods"]) or "*"
            headers = " ".join(f"{k}~{v}" for k, v in route["headers"])
            output.console.print(f"  route {methods} {route['path_regex']} {headers}".rstrip())
        for conflict in body.get("conflicts", []):
            output.console.print(f"  [yellow]conflict[/] {conflict}")
    if not body["allowed"]:
        raise SystemExit(NEGATIVE)
