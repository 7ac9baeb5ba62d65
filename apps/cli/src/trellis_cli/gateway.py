"""``trellis gateway``: onboard and run the Envoy that serves a Gateway API Gateway.

A Gateway ``<ns>/<gw>`` whose GatewayClass names the controller ``trellis.dev/gateway`` is
served by a gateway Envoy connected to proxy-cp as the identity ``<ns>/<gw>`` (service
account ``<gw>`` unless told otherwise): the catalog puts the Gateway's listeners and routes
in that identity's view, and proxy-cp serves them to a proxy whose node metadata says
``trellis.gateway: true``.

Everything else is a VM sidecar's (:mod:`.vm`), and is done by its code: the key is made
here and only a CSR goes to the injector (``POST /v1/bootstrap``, with an onboarding token
or the admin token); the proxy certificate, the workload certificate, the key, the trust
bundle and the bootstrap are written to ``--out`` by :func:`.proxyfolder.write_proxy_folder`; the
certificates are renewed through proxy-cp by :func:`.renew.watch`, as ``trellis proxy renew
--watch`` does. Two things differ, both in the bootstrap's ``node.metadata.trellis``, which
the CLI sets on the injector's answer before writing it (as the pod agent sets the node id,
:func:`.agent.bootstrap_with_node`): ``gateway: true``, and ``gateway_certs_dir``, the
folder where the certificates of HTTPS listeners are, one ``<secret-ns>/<secret-name>/``
(``tls.crt``, ``tls.key``) per Secret. Envoy reads them there itself: no listener's key goes
through the control plane.

A gateway has no application and no sidecar listeners, but the injector's ``/v1/bootstrap``
asks for an inbound and an outbound port; the CLI sends two ports free on this host, which
proxy-cp does not use for a gateway. ``run`` is :mod:`.gatewayrun`; in a Kubernetes pod,
``run --enroll`` onboards as a pod's agent does instead (:mod:`.gatewaypod`).
"""

from __future__ import annotations

import re
import shlex
import socket
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from trellis_cli import output
from trellis_cli.client import CliError, Mesh
from trellis_cli.proxyfolder import BOOTSTRAP_FILE, ProxyFolder, envoy_command, write_proxy_folder
from trellis_cli.vm import INJECTOR, onboarding_token, token_file_option

#: The GatewayClass controller name whose Gateways Trellis serves.
CONTROLLER = "trellis.dev/gateway"
#: ``--certs-dir``'s default, inside ``--out``.
CERTS_FOLDER = "certs"
#: What proxy-cp accepts as a folder in node metadata (absolute, plain names).
_FOLDER = re.compile(r"(/[A-Za-z0-9._-]+)+")


@dataclass(frozen=True, slots=True)
class GatewayProxy:
    """One gateway Envoy to onboard: whose it is, and its own ports on this host."""

    namespace: str
    name: str
    service_account: str = ""
    admin_port: int = 15000
    stats_port: int = 0
    protocol: str = "sotw"

    @property
    def identity(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def account(self) -> str:
        return self.service_account or self.name


def certs_folder(given: Path) -> Path:
    """``--certs-dir`` as an absolute folder proxy-cp accepts in the node metadata."""
    folder = given.expanduser().resolve()
    text = str(folder)
    if len(text) > 200 or not _FOLDER.fullmatch(text):
        raise click.BadParameter(
            f"{text!r} must be an absolute path of plain names (letters, digits, '.', '_', "
            "'-'), at most 200 characters: proxy-cp reads it from the bootstrap",
            param_hint="--certs-dir",
        )
    return folder


def free_ports(count: int) -> list[int]:
    """``count`` different TCP ports nothing listens on now on 127.0.0.1."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def with_gateway_metadata(bootstrap: dict[str, Any], certs_dir: Path) -> dict[str, Any]:
    """The injector's bootstrap, its node marked a gateway whose certificates are in
    ``certs_dir``."""
    node = bootstrap.get("node")
    if not isinstance(node, dict):
        raise CliError("the injector's answer is not an Envoy bootstrap with a node")
    metadata = dict(node.get("metadata") or {})
    section = dict(metadata.get("trellis") or {})
    section.update(gateway=True, gateway_certs_dir=str(certs_dir))
    metadata["trellis"] = section
    return {**bootstrap, "node": {**node, "metadata": metadata}}


def onboard(
    mesh: Mesh, proxy: GatewayProxy, folder: Path, certs_dir: Path, token: str | None
) -> tuple[dict[str, Any], ProxyFolder]:
    """Onboard the gateway's Envoy as ``trellis vm bootstrap`` onboards a sidecar, and
    write its folder; (the injector's answer, what was written)."""
    from trellis_identity import identity  # gRPC and cryptography: only onboarding needs them

    key_pem, key = identity.new_key()  # the proxy's key: made here, never sent
    inbound, outbound = free_ports(2)
    body = {
        "namespace": proxy.namespace,
        "service": proxy.name,
        "service_account": proxy.service_account,
        "app_port": 0,
        "inbound_port": inbound,
        "outbound_port": outbound,
        "admin_port": proxy.admin_port,
        "stats_port": proxy.stats_port,
        "protocol": proxy.protocol,
        "output_dir": str(folder),
        "csr_pem": identity.csr_for(key, proxy.identity).decode(),
    }
    result = mesh.call(INJECTOR, "POST", "/v1/bootstrap", auth=True, bearer=token, json=body)
    result["bootstrap"] = with_gateway_metadata(result["bootstrap"], certs_dir)
    try:
        certs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot make the certificates' folder {certs_dir}: {exc}") from exc
    return result, write_proxy_folder(folder, key_pem, result)


def gateway_options(function: Any) -> Any:
    """The options ``bootstrap`` and ``run`` share, outermost first."""
    options = (
        click.option("--namespace", "-n", required=True, help="The Gateway's namespace."),
        click.option("--name", required=True, help="The Gateway's name."),
        click.option("--service-account", default="", help="Its identity (default: --name)."),
        click.option(
            "--admin-port",
            type=click.IntRange(1, 65535),
            default=15000,
            show_default=True,
            help="Envoy's admin API (127.0.0.1).",
        ),
        click.option(
            "--stats-port",
            type=click.IntRange(0, 65535),
            default=0,
            show_default=True,
            help="Serve Envoy's statistics for Prometheus on this port; 0: no.",
        ),
        click.option(
            "--protocol",
            type=click.Choice(["sotw", "delta"]),
            default="sotw",
            show_default=True,
        ),
        click.option(
            "--out",
            required=True,
            type=click.Path(file_okay=False, path_type=Path),
            help="Directory for the proxy's files (created if missing).",
        ),
        click.option(
            "--certs-dir",
            type=click.Path(file_okay=False, path_type=Path),
            help="Where the HTTPS listeners' certificates are: "
            "<dir>/<secret-namespace>/<secret-name>/tls.crt and tls.key "
            f"[default: <out>/{CERTS_FOLDER}].",
        ),
        token_file_option,
    )
    for option in reversed(options):
        function = option(function)
    return function


def gateway_of(
    namespace: str,
    name: str,
    service_account: str,
    admin_port: int,
    stats_port: int,
    protocol: str,
    out: Path,
    certs_dir: Path | None,
) -> tuple[GatewayProxy, Path, Path]:
    """The options, checked: (the proxy, its folder, its certificates' folder)."""
    if stats_port and stats_port == admin_port:
        raise click.BadParameter("must differ from --admin-port", param_hint="--stats-port")
    folder = out.expanduser().resolve()
    certs = certs_folder(certs_dir if certs_dir is not None else folder / CERTS_FOLDER)
    proxy = GatewayProxy(namespace, name, service_account, admin_port, stats_port, protocol)
    return proxy, folder, certs


@click.group(help="Gateway API Gateways served by a Trellis gateway Envoy.")
def gateway() -> None:
    pass


@gateway.command(
    help="Onboard a Gateway's Envoy (its key made here, only a CSR sent) and write its files "
    "to --out (envoy.yaml, certificates, key.pem 0600), without running it."
)
@gateway_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON (without the private key).")
@click.pass_obj
def bootstrap(mesh: Mesh, /, token_file: Path | None, as_json: bool, **options: Any) -> None:
    proxy, folder, certs = gateway_of(**options)
    result, written = onboard(mesh, proxy, folder, certs, onboarding_token(token_file))
    command = envoy_command(written.config)
    if as_json:
        output.emit_json(
            {
                "common_name": result["common_name"],
                "xds_address": result["xds_address"],
                "bootstrap": result["bootstrap"],
                "certs_dir": str(certs),
                "files": {
                    "bootstrap": str(written.config),
                    "cert_chain": str(written.cert_chain),
                    "workload_cert": str(written.workload_cert),
                    "key": str(written.key),
                    "trust_bundle": str(written.trust_bundle),
                },
                "envoy_command": command,
            }
        )
        return
    click.echo(
        f"onboarded gateway proxy {result['common_name']} ({proxy.identity}, service account "
        f"{proxy.account})"
    )
    click.echo(f"wrote {written.config}, its certificates and key in {folder}")
    click.echo(f"HTTPS listeners' certificates go in {certs}/<secret-ns>/<secret-name>/")
    click.echo("run it (and keep its certificates renewed: `trellis proxy renew --watch`):")
    click.echo(f"  trellis envoy run {shlex.join(command[1:])}")


@gateway.command(
    help="Onboard a Gateway's Envoy as `gateway bootstrap` does (or, with --enroll, as an "
    "injected pod's agent does), then run it in the foreground, renewing its certificates "
    "through proxy-cp; SIGTERM or Ctrl-C stops it. Exits with an error when Envoy ends by "
    "itself (a supervisor restarts it)."
)
@gateway_options
@click.option(
    "--envoy-arg",
    "envoy_args",
    multiple=True,
    help="One more argument for Envoy (repeatable), e.g. --envoy-arg=--log-level=warning.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="Seconds Envoy gets to stop after SIGTERM before it is killed.",
)
@click.option(
    "--enroll",
    is_flag=True,
    help="In a Kubernetes pod: enroll with the pod's ServiceAccount token at proxy-cp's "
    "enrollment port, as an injected pod's agent does (TRELLIS_AGENT_ADDRESS, "
    "TRELLIS_AGENT_SERVER_NAME, TRELLIS_AGENT_CA, TRELLIS_AGENT_TOKEN), instead of "
    "onboarding through the injector; the pod's ServiceAccount is the identity.",
)
@click.option(
    "--xds-address",
    default="",
    help="With --enroll: proxy-cp's xDS address, HOST:PORT.",
)
@click.option(
    "--proxy-cp-id",
    default="spiffe://cluster.local/ns/trellis-system/sa/proxy-cp",
    show_default=True,
    help="With --enroll: the SPIFFE id proxy-cp's xDS port is accepted by.",
)
@click.pass_obj
def run(
    mesh: Mesh,
    /,
    token_file: Path | None,
    envoy_args: tuple[str, ...],
    grace: float,
    enroll: bool,
    xds_address: str,
    proxy_cp_id: str,
    **options: Any,
) -> None:
    from trellis_cli import gatewayrun

    proxy, folder, certs = gateway_of(**options)
    if enroll and not xds_address:
        raise click.UsageError("--enroll needs --xds-address (proxy-cp's xDS HOST:PORT)")
    gatewayrun.configure_logging()
    stop = gatewayrun.stop_on_signals()
    renewer = None
    if enroll:
        from trellis_cli import gatewaypod

        config = gatewaypod.agent_config(proxy, folder, certs, xds_address, proxy_cp_id)
        folder.mkdir(parents=True, exist_ok=True)
        certs.mkdir(mode=0o700, parents=True, exist_ok=True)
        (folder / BOOTSTRAP_FILE).unlink(missing_ok=True)  # a previous container's
        renewer = gatewaypod.enrolling(config, stop)
        if not gatewaypod.wait_enrolled(config, stop):
            return
        gatewayrun.log.info("gateway.enrolled gateway=%s dir=%s", proxy.identity, folder)
    else:
        result, _ = onboard(mesh, proxy, folder, certs, onboarding_token(token_file))
        gatewayrun.log.info(
            "gateway.onboarded gateway=%s node=%s xds=%s dir=%s certs_dir=%s",
            proxy.identity,
            result["common_name"],
            result["xds_address"],
            folder,
            certs,
        )
    gatewayrun.serve(
        proxy.identity, folder / BOOTSTRAP_FILE, list(envoy_args), stop, grace, renewer
    )
