"""``trellis dst get|profile NAME``: what a Linkerd Destination API client would receive.

Asks proxy-cp's admin API (``/v1/destinations/get`` and ``/profile``), which resolves the
name as a new stream would, and prints the messages such a stream starts with.
"""

from __future__ import annotations

from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import Mesh

NAME_HELP = "<service>.<namespace>.svc.cluster.local:<port>, IP:port, or a ServiceEntry host"


@click.group(help="The Linkerd Destination API as proxy-cp serves it (port 8086).")
def dst() -> None:
    pass


@dst.command(help=f"The first messages of Get(NAME). NAME: {NAME_HELP}.")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the messages as JSON.")
@click.pass_obj
def get(mesh: Mesh, name: str, as_json: bool) -> None:
    body = mesh.get_json("proxy-cp", "/v1/destinations/get", params={"path": name}, auth=True)
    if as_json:
        output.emit_json(body)
        return
    for update in body["updates"]:
        if "no_endpoints" in update:
            exists = bool(update["no_endpoints"].get("exists", False))
            output.console.print(f"no_endpoints exists={str(exists).lower()}")
            continue
        added = update.get("add", {})
        labels = _labels(added.get("metric_labels", {}))
        output.console.print(f"add {len(added.get('addrs', []))} address(es) {labels}".rstrip())
        output.table(
            name,
            ["address", "weight", "identity", "server name", "hint", "labels"],
            [_row(a) for a in added.get("addrs", [])],
        )


def _row(addr: dict[str, Any]) -> list[str]:
    tls = addr.get("tls_identity", {})
    hint = addr.get("protocol_hint", {})
    return [
        addr.get("addr", {}).get("text", ""),
        str(addr.get("weight", 0)),
        tls.get("uri_like_identity", {}).get("uri", "") or "(no TLS identity)",
        tls.get("server_name", {}).get("name", ""),
        "h2" if "h2" in hint else "opaque" if "opaque" in hint else "",
        _labels(addr.get("metric_labels", {})),
    ]


def _labels(labels: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if v)


@dst.command(help=f"The first message of GetProfile(NAME). NAME: {NAME_HELP}.")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
@click.pass_obj
def profile(mesh: Mesh, name: str, as_json: bool) -> None:
    body = mesh.get_json("proxy-cp", "/v1/destinations/profile", params={"path": name}, auth=True)
    found = body["profile"]
    if as_json:
        output.emit_json(body)
        return
    fqn = found.get("fully_qualified_name") or "(unknown: not a service of the mesh)"
    output.console.print(f"fully qualified name: {fqn}")
    budget = found.get("retry_budget", {})
    output.console.print(
        f"retry budget: ratio {budget.get('retry_ratio', 0):.2f}, "
        f"{budget.get('min_retries_per_second', 0)}/s minimum, ttl {budget.get('ttl', '0s')}"
    )
    if found.get("opaque_protocol"):
        output.console.print("opaque protocol")
    if "endpoint" in found:
        output.console.print(f"endpoint: {found['endpoint'].get('addr', {})}")
    output.table(
        "routes",
        ["route", "condition", "retryable", "timeout"],
        [
            [
                r.get("metrics_labels", {}).get("route", ""),
                _condition(r.get("condition", {})),
                "yes" if r.get("is_retryable") else "no",
                r.get("timeout", ""),
            ]
            for r in found.get("routes", [])
        ],
    )
    output.table(
        "traffic split (dst_overrides)",
        ["authority", "weight"],
        [
            [d["authority"], f"{d.get('weight', 0) / 100:.2f}%"]
            for d in found.get("dst_overrides", [])
        ],
    )


def _condition(match: dict[str, Any]) -> str:
    if "path" in match:
        return f"path ~ {match['path'].get('regex', '')}"
    if "method" in match:
        method = match["method"]
        return f"method {method.get('registered', method.get('unregistered', 'GET'))}"
    for kind, joiner in (("all", " and "), ("any", " or ")):
        if kind in match:
            parts = [_condition(m) for m in match[kind].get("matches", [])]
            return "(" + joiner.join(parts) + ")"
    if "not" in match:
        return f"not {_condition(match['not'])}"
    return "*"
