"""``trellis vm``: register workloads that run outside Kubernetes, heartbeat, list, remove."""

from __future__ import annotations

import time
from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import Mesh

SERVICE = "endpoints-vm"


def parse_port(text: str) -> dict[str, Any]:
    name, sep, number = text.rpartition("=")
    if not sep:
        name, number = "", text
    try:
        value = int(number)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected [NAME=]NUMBER", param_hint="--port") from None
    return {"name": name, "number": value}


def parse_label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise click.BadParameter(f"{text!r}: expected KEY=VALUE", param_hint="--label")
    return key, value


@click.group(help="Workloads outside Kubernetes (VMs, machines): the endpoints-vm registry.")
def vm() -> None:
    pass


@vm.command(help="Register a workload as an endpoint of one or more services.")
@click.option("--namespace", "-n", required=True)
@click.option("--name", required=True, help="The workload's name (unique in its namespace).")
@click.option("--service", "services", multiple=True, required=True, help="Repeatable.")
@click.option("--address", required=True, help="The workload's IP address.")
@click.option("--port", "ports", multiple=True, required=True, help="[NAME=]NUMBER, repeatable.")
@click.option("--service-account", default="", help="Identity for policy (default: 'default').")
@click.option("--label", "labels", multiple=True, help="KEY=VALUE, repeatable.")
@click.option("--locality", default="", help="region[/zone[/subzone]].")
@click.option("--network", default="")
@click.option("--weight", type=int, default=1, show_default=True)
@click.option("--ttl", type=float, help="Seconds without a heartbeat before it is taken out.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def register(
    mesh: Mesh,
    namespace: str,
    name: str,
    services: tuple[str, ...],
    address: str,
    ports: tuple[str, ...],
    service_account: str,
    labels: tuple[str, ...],
    locality: str,
    network: str,
    weight: int,
    ttl: float | None,
    as_json: bool,
) -> None:
    body = {
        "namespace": namespace,
        "name": name,
        "services": list(services),
        "address": address,
        "ports": [parse_port(p) for p in ports],
        "service_account": service_account,
        "labels": dict(parse_label(label) for label in labels),
        "locality": locality,
        "network": network,
        "weight": weight,
        "ttl": ttl,
    }
    result = mesh.request(SERVICE, "POST", "/v1/workloads", auth=True, json=body).json()
    if as_json:
        output.emit_json(result)
        return
    expiry = f", heartbeat within {ttl:g}s" if ttl else ""
    output.console.print(
        f"registered {namespace}/{name} ({address}) in {', '.join(services)}{expiry}"
    )


@vm.command(help="Tell endpoints-vm the workload is alive (for workloads with --ttl).")
@click.option("--namespace", "-n", required=True)
@click.option("--name", required=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def heartbeat(mesh: Mesh, namespace: str, name: str, as_json: bool) -> None:
    result = mesh.request(
        SERVICE, "POST", f"/v1/workloads/{namespace}/{name}/heartbeat", auth=True
    ).json()
    if as_json:
        output.emit_json(result)
        return
    expires = result.get("expires_at")
    left = f"; next one due within {expires - time.time():.0f}s" if expires else ""
    output.console.print(f"heartbeat recorded for {namespace}/{name}{left}")


@vm.command(help="Remove a workload from the registry and from its services.")
@click.option("--namespace", "-n", required=True)
@click.option("--name", required=True)
@click.pass_obj
def deregister(mesh: Mesh, namespace: str, name: str) -> None:
    mesh.request(SERVICE, "DELETE", f"/v1/workloads/{namespace}/{name}", auth=True)
    output.console.print(f"deregistered {namespace}/{name}")


@vm.command("list", help="Registered workloads and whether they are in service.")
@click.option("--namespace", "-n", default="", help="Only this namespace.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_obj
def list_(mesh: Mesh, namespace: str, as_json: bool) -> None:
    body = mesh.get_json(SERVICE, "/v1/workloads", params={"namespace": namespace})
    if as_json:
        output.emit_json(body)
        return
    now = time.time()
    rows = []
    for w in body["workloads"]:
        ports = ",".join(
            f"{p['name']}={p['number']}" if p["name"] else str(p["number"]) for p in w["ports"]
        )
        if w["ttl"] is None:
            state = "registered"
        elif w["alive"]:
            state = f"alive ({w['expires_at'] - now:.0f}s left)"
        else:
            state = f"EXPIRED {now - w['expires_at']:.0f}s ago"
        rows.append(
            (
                f"{w['namespace']}/{w['name']}",
                ",".join(w["services"]),
                w["address"],
                ports,
                w["service_account"] or "default",
                state,
            )
        )
    output.table(
        f"Workloads (revision {body['revision']})",
        ["WORKLOAD", "SERVICES", "ADDRESS", "PORTS", "SERVICE ACCOUNT", "STATE"],
        rows,
    )
