"""``trellis status``: every service's health, from its admin API; non-zero if any fails."""

from __future__ import annotations

from typing import Any

import click
import httpx

from trellis_cli import output
from trellis_cli.client import Mesh
from trellis_cli.up import SERVICES
from trellis_common import statefile


def probe(mesh: Mesh, name: str) -> dict[str, Any]:
    url = mesh.admin_url(name)
    try:
        response = httpx.get(url + "/readyz", timeout=2.0)
        body = response.json()
        return {
            "service": name,
            "admin_url": url,
            "healthy": response.status_code == 200,
            "checks": body.get("checks", {}),
        }
    except (httpx.HTTPError, ValueError) as exc:
        return {"service": name, "admin_url": url, "healthy": False, "error": type(exc).__name__}


@click.command(help="Health of each service of the running mesh; exit 1 if any is unhealthy.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def status(mesh: Mesh, as_json: bool) -> None:
    known = statefile.read_endpoints(mesh.state_dir)
    names = list(known) or [name for name, *_ in SERVICES]
    results = [probe(mesh, name) for name in names]
    if as_json:
        output.emit_json({"services": results})
    else:
        output.table(
            "Trellis services",
            ["SERVICE", "ADMIN", "HEALTH", "CHECKS"],
            [
                (
                    r["service"],
                    r["admin_url"],
                    "ok" if r["healthy"] else "UNHEALTHY",
                    r.get("error")
                    or " ".join(f"{k}={'ok' if v else 'fail'}" for k, v in r["checks"].items()),
                )
                for r in results
            ],
        )
    if not all(r["healthy"] for r in results):
        raise SystemExit(1)
