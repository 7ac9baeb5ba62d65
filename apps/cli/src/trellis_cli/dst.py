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
@output.format_option
@click.pass_obj
def get(mesh: Mesh, name: str, fmt: output.Format) -> None:
    body = mesh.get_json("proxy-cp", "/v1/destinations/get", params={"path": name}, auth=True)
    if output.emit(fmt, body):
        return
    for update in body["updates"]:
        if "no_endpoints" in update:
            exists = bool(update["no_endpoints"].get("exists", False))
            output.console.print(f"no_endpoints exists={str(exists).lower()}")
            continue
        added = update.get("add", {})
        labels = _labels(added.get("metric_labels", {}))
        output.console.print(f"add {len(added.get('addrs', []))} address(es) {labels}".rstrip())
        output.listing(fmt, name, ADDRESS_COLUMNS, added.get("addrs", []))


def _hint(addr: dict[str, Any]) -> str:
    hint = addr.get("protocol_hint", {})
    return "h2" if "h2" in hint else "opaque" if "opaque" in hint else ""


def _workload(addr: dict[str, Any]) -> str:
    """The workload behind the address (``Pod shop/web-1``), as Linkerd's ``resource_ref``."""
    ref = addr.get("resource_ref", {}).get("resource", {})
    if not ref.get("name"):
        return "-"
    return f"{ref.get('kind', '')} {ref.get('namespace', '')}/{ref['name']}".strip()


def _tls(addr: dict[str, Any], field: str, leaf: str) -> str:
    return str(addr.get("tls_identity", {}).get(field, {}).get(leaf, ""))


ADDRESS_COLUMNS = [
    output.Column("address", lambda a: a.get("addr", {}).get("text", "")),
    output.Column("weight", lambda a: str(a.get("weight", 0))),
    output.Column("identity", lambda a: _tls(a, "uri_like_identity", "uri") or "(no TLS identity)"),
    output.Column("server name", lambda a: _tls(a, "server_name", "name")),
    output.Column("hint", _hint),
    output.Column("labels", lambda a: _labels(a.get("metric_labels", {}))),
    output.Column("workload", _workload, wide=True),
]


def _labels(labels: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(labels.items()) if v)


@dst.command(help=f"The first message of GetProfile(NAME). NAME: {NAME_HELP}.")
@click.argument("name")
@output.format_option
@click.pass_obj
def profile(mesh: Mesh, name: str, fmt: output.Format) -> None:
    body = mesh.get_json("proxy-cp", "/v1/destinations/profile", params={"path": name}, auth=True)
    if output.emit(fmt, body):
        return
    found = body["profile"]
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
    output.listing(
        fmt,
        "routes",
        [
            output.Column("route", lambda r: r.get("metrics_labels", {}).get("route", "")),
            output.Column("condition", lambda r: _condition(r.get("condition", {}))),
            output.Column("retryable", lambda r: "yes" if r.get("is_retryable") else "no"),
            output.Column("timeout", lambda r: r.get("timeout", "")),
            output.Column("labels", lambda r: _labels(r.get("metrics_labels", {})), wide=True),
            output.Column(
                "response classes", lambda r: len(r.get("response_classes", [])), wide=True
            ),
        ],
        found.get("routes", []),
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
