"""``trellis vm``: onboard proxies of workloads outside Kubernetes, register the workloads,
heartbeat, list, remove.

Credentials: ``bootstrap`` and ``register`` send an onboarding token scoped to the
workload's identity when one is given (``--token-file``, or ``TRELLIS_ONBOARDING_TOKEN``),
else the admin token. ``bootstrap`` makes the proxy's key on this host and sends only a CSR.
``register`` keeps the workload's heartbeat token (0600, ``--token-out`` or
``<state-dir>/heartbeat-tokens/<namespace>/<name>``), which ``heartbeat`` sends: endpoints-vm
accepts no other credential for it.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import CliError, Mesh
from trellis_cli.proxyfolder import (
    envoy_command,
    write_private,
    write_proxy_folder,
)

SERVICE = "endpoints-vm"
INJECTOR = "injector"
ONBOARDING_TOKEN_ENV = "TRELLIS_ONBOARDING_TOKEN"
HEARTBEAT_TOKENS = "heartbeat-tokens"

token_file_option = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help=f"An onboarding token for this identity (`trellis token create`); or set "
    f"{ONBOARDING_TOKEN_ENV}. Without either, the admin token is sent.",
)


def onboarding_token(token_file: Path | None) -> str | None:
    """The onboarding token given, or ``None`` (the admin token is sent instead)."""
    if token_file is not None:
        token = token_file.read_text().strip()
        if not token:
            raise CliError(f"{token_file} is empty: it should hold an onboarding token")
        return token
    return os.environ.get(ONBOARDING_TOKEN_ENV) or None


def heartbeat_token_path(state_dir: Path, namespace: str, name: str) -> Path:
    """Where ``register`` keeps a workload's heartbeat token unless told otherwise."""
    return state_dir / HEARTBEAT_TOKENS / namespace / name


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
@token_file_option
@click.option(
    "--token-out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to keep the workload's heartbeat token (0600) [default: "
    "<state-dir>/heartbeat-tokens/<namespace>/<name>].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (without the token).")
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
    token_file: Path | None,
    token_out: Path | None,
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
    token = onboarding_token(token_file)
    result = mesh.call(SERVICE, "POST", "/v1/workloads", auth=True, bearer=token, json=body)
    kept = token_out or heartbeat_token_path(mesh.state_dir, namespace, name)
    try:
        kept.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(kept, result.pop("heartbeat_token") + "\n")
    except OSError as exc:
        raise CliError(
            f"registered, but the heartbeat token cannot be kept at {kept}: {exc}"
        ) from exc
    if as_json:
        output.emit_json({**result, "heartbeat_token_file": str(kept)})
        return
    expiry = f", heartbeat within {ttl:g}s" if ttl else ""
    output.console.print(
        f"registered {namespace}/{name} ({address}) in {', '.join(services)}{expiry}; "
        f"heartbeat token in {kept} (mode 0600)"
    )


def heartbeat_token(mesh: Mesh, namespace: str, name: str, token_file: Path | None) -> str:
    path = token_file or heartbeat_token_path(mesh.state_dir, namespace, name)
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise CliError(
            f"no heartbeat token for {namespace}/{name} at {path} ({exc.strerror}): "
            "`trellis vm register` keeps it there (or give --token-file)"
        ) from exc
    if not token:
        raise CliError(f"{path} is empty: register the workload again for a heartbeat token")
    return token


heartbeat_token_option = click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The workload's heartbeat token [default: "
    "<state-dir>/heartbeat-tokens/<namespace>/<name>, where `register` keeps it].",
)


@vm.command(help="Tell endpoints-vm the workload is alive (for workloads with --ttl).")
@click.option("--namespace", "-n", required=True)
@click.option("--name", required=True)
@heartbeat_token_option
@click.option(
    "--every",
    type=click.FloatRange(min=0.05),
    help="Keep heartbeating every SECONDS until stopped (SIGTERM, Ctrl-C), as a VM agent: "
    "all on one kept-alive HTTPS connection, a failed heartbeat retried with backoff.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one line per heartbeat).")
@click.pass_obj
def heartbeat(
    mesh: Mesh,
    namespace: str,
    name: str,
    token_file: Path | None,
    every: float | None,
    as_json: bool,
) -> None:
    token = heartbeat_token(mesh, namespace, name, token_file)
    path = f"/v1/workloads/{namespace}/{name}/heartbeat"
    if every is not None:
        from trellis_cli import keepalive  # only the agent's loop needs it

        keepalive.heartbeat_every(mesh, SERVICE, path, token, every, as_json=as_json)
        return
    result = mesh.call(SERVICE, "POST", path, bearer=token)
    if as_json:
        output.emit_json(result)
        return
    expires = result.get("expires_at")
    left = f"; next one due within {expires - time.time():.0f}s" if expires else ""
    output.console.print(f"heartbeat recorded for {namespace}/{name}{left}")


@vm.command(
    help="Remove a workload from the registry and from its services (with its heartbeat "
    "token if --token-file is given, else the admin token)."
)
@click.option("--namespace", "-n", required=True)
@click.option("--name", required=True)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The workload's heartbeat token; without it, the admin token (operators).",
)
@click.pass_obj
def deregister(mesh: Mesh, namespace: str, name: str, token_file: Path | None) -> None:
    token = heartbeat_token(mesh, namespace, name, token_file) if token_file else None
    mesh.request(SERVICE, "DELETE", f"/v1/workloads/{namespace}/{name}", auth=True, bearer=token)
    heartbeat_token_path(mesh.state_dir, namespace, name).unlink(missing_ok=True)
    output.console.print(f"deregistered {namespace}/{name}")


def _ports(workload: dict[str, Any]) -> str:
    return ",".join(
        f"{p['name']}={p['number']}" if p["name"] else str(p["number"]) for p in workload["ports"]
    )


def _state(workload: dict[str, Any], now: float) -> str:
    if workload["ttl"] is None:
        return "registered"
    if workload["alive"]:
        return f"alive ({workload['expires_at'] - now:.0f}s left)"
    state = f"EXPIRED {now - workload['expires_at']:.0f}s ago"
    reaped_at = workload.get("reaped_at")  # when the leader deregisters it (reap_after)
    return f"{state}, deregistered in {output.span(reaped_at - now)}" if reaped_at else state


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "-"


@vm.command("list", help="Registered workloads and whether they are in service.")
@click.option("--namespace", "-n", default="", help="Only this namespace.")
@output.format_option
@click.pass_obj
def list_(mesh: Mesh, namespace: str, fmt: output.Format) -> None:
    body = mesh.get_json(SERVICE, "/v1/workloads", params={"namespace": namespace})
    if output.emit(fmt, body):
        return
    now = time.time()
    output.listing(
        fmt,
        f"Workloads (revision {body['revision']})",
        [
            output.Column("WORKLOAD", lambda w: f"{w['namespace']}/{w['name']}"),
            output.Column("SERVICES", lambda w: ",".join(w["services"])),
            output.Column("ADDRESS", lambda w: w["address"]),
            output.Column("PORTS", _ports),
            output.Column("SERVICE ACCOUNT", lambda w: w["service_account"] or "default"),
            output.Column("STATE", lambda w: _state(w, now)),
            output.Column("LABELS", lambda w: _labels(w.get("labels") or {}), wide=True),
            output.Column("LOCALITY", lambda w: w.get("locality") or "-", wide=True),
            output.Column("NETWORK", lambda w: w.get("network") or "-", wide=True),
            output.Column("WEIGHT", lambda w: w.get("weight") or "-", wide=True),
            output.Column("AGE", lambda w: output.age(w.get("registered_at"), now), wide=True),
            output.Column(
                "LAST HEARTBEAT", lambda w: output.age(w.get("last_heartbeat"), now), wide=True
            ),
        ],
        body["workloads"],
    )


@vm.command(
    help="Onboard a workload's proxy: its key is made here (key.pem, 0600) and only a CSR is "
    "sent; the injector answers with the proxy certificate and an Envoy bootstrap. All are "
    "written to --out (envoy.yaml, cert.pem, key.pem, ca.pem)."
)
@click.option("--namespace", "-n", required=True)
@click.option("--service", required=True, help="The service the workload belongs to.")
@click.option("--service-account", default="", help="Identity for policy (default: the service).")
@click.option(
    "--app-port", type=int, required=True, help="The application's port; 0 if it only calls out."
)
@click.option(
    "--inbound-port", type=int, required=True, help="Where peers reach the workload (mTLS)."
)
@click.option("--outbound-port", type=int, required=True, help="Where the app sends its calls.")
@click.option("--admin-port", type=int, required=True, help="Envoy's admin API (127.0.0.1).")
@click.option(
    "--stats-port",
    type=int,
    default=0,
    show_default=True,
    help="Serve Envoy's statistics for Prometheus on this port (/stats/prometheus); 0: no.",
)
@click.option("--protocol", type=click.Choice(["sotw", "delta"]), default="sotw", show_default=True)
@click.option(
    "--locality",
    default="",
    help="Where the workload runs, region[/zone[/subzone]] (Envoy's node.locality): with "
    "outlier detection on a service, the proxy prefers its own locality's endpoints and "
    "fails over outward. Register the workload with the same --locality.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the proxy's files (created if missing), on the proxy's host.",
)
@token_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (without the private key).")
@click.pass_obj
def bootstrap(
    mesh: Mesh,
    namespace: str,
    service: str,
    service_account: str,
    app_port: int,
    inbound_port: int,
    outbound_port: int,
    admin_port: int,
    stats_port: int,
    protocol: str,
    locality: str,
    out: Path,
    token_file: Path | None,
    as_json: bool,
) -> None:
    folder = out.resolve()
    from trellis_identity import identity  # gRPC and cryptography: only this command needs them

    key_pem, key = identity.new_key()  # the proxy's key: made here, never sent
    body = {
        "namespace": namespace,
        "service": service,
        "service_account": service_account,
        "app_port": app_port,
        "inbound_port": inbound_port,
        "outbound_port": outbound_port,
        "admin_port": admin_port,
        "stats_port": stats_port,
        "protocol": protocol,
        "locality": locality,
        "output_dir": str(folder),
        "csr_pem": identity.csr_for(key, f"{namespace}/{service}").decode(),
    }
    token = onboarding_token(token_file)
    result = mesh.call(INJECTOR, "POST", "/v1/bootstrap", auth=True, bearer=token, json=body)
    written = write_proxy_folder(folder, key_pem, result)
    config, cert_chain, workload = written.config, written.cert_chain, written.workload_cert
    key_file, trust_bundle = written.key, written.trust_bundle
    command = envoy_command(config)
    account = service_account or service
    if as_json:
        output.emit_json(
            {
                "common_name": result["common_name"],
                "xds_address": result["xds_address"],
                "bootstrap": result["bootstrap"],
                "files": {
                    "bootstrap": str(config),
                    "cert_chain": str(cert_chain),
                    "workload_cert": str(workload),
                    "key": str(key_file),
                    "trust_bundle": str(trust_bundle),
                },
                "envoy_command": command,
            }
        )
        return
    click.echo(
        f"onboarded proxy {result['common_name']} ({namespace}/{service}, "
        f"service account {account})"
    )
    click.echo(f"wrote {config}, {cert_chain}, {workload}, {key_file} (mode 0600), {trust_bundle}")
    click.echo(f"start the sidecar (it connects to proxy-cp at {result['xds_address']}, mTLS):")
    click.echo(f"  trellis envoy run {shlex.join(command[1:])}")
    q = shlex.quote
    register = (
        f"trellis vm register -n {q(namespace)} --name WORKLOAD --service {q(service)} "
        f"--address ADDRESS --port NAME={inbound_port} --service-account {q(account)}"
        + (f" --locality {q(locality)}" if locality else "")
    )
    if app_port:
        click.echo("then register the workload, so peers reach it through the sidecar")
    else:
        click.echo("app port 0: the workload only calls out; should peers reach it later")
    click.echo("(NAME: the Service port's name, ADDRESS: where peers reach this host):")
    click.echo(f"  {register}")
