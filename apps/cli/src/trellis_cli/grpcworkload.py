"""``trellis grpc``: proxyless gRPC workloads, which join the mesh with no sidecar.

``bootstrap`` onboards one like a proxy (its key is made here; only a CSR is sent to the
injector, with an onboarding token or the admin token), and writes the folder
:mod:`trellis_common.grpc_bootstrap` describes: the proxy certificate (xDS channel) and the
workload's own certificate (its account's SPIFFE id), both for that key, ``bootstrap.json``
last. ``agent`` renews both before they expire (:mod:`.grpcrenew`).
"""

from __future__ import annotations

import json
import logging
import shlex
from pathlib import Path

import click

from trellis_cli import output
from trellis_cli.client import CliError, Mesh
from trellis_cli.grpcrenew import Certificates, install, watch
from trellis_cli.proxyfolder import write_file
from trellis_cli.vm import INJECTOR, onboarding_token, token_file_option
from trellis_common.grpc_bootstrap import GrpcFolder
from trellis_identity import identity


@click.group(name="grpc", help="Proxyless gRPC workloads: bootstrap files and their agent.")
def grpc_group() -> None:
    pass


@grpc_group.command(
    help="Onboard a proxyless gRPC workload: write DIR/bootstrap.json (GRPC_XDS_BOOTSTRAP) "
    "and the files it names: the proxy certificate for the xDS channel, the workload's own "
    "certificate (its service account's SPIFFE id), both for one key made here, and the "
    "mesh CA."
)
@click.option("--namespace", "-n", required=True)
@click.option("--service", required=True, help="The service the workload belongs to.")
@click.option("--service-account", default="", help="Identity for policy (default: the service).")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for the files (created if missing).",
)
@token_file_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (never a private key).")
@click.pass_obj
def bootstrap(
    mesh: Mesh,
    namespace: str,
    service: str,
    service_account: str,
    out: Path,
    token_file: Path | None,
    as_json: bool,
) -> None:
    files = GrpcFolder(out.resolve())
    key_pem, key = identity.new_key()  # the workload's key: made here, never sent
    body = {
        "kind": "grpc",
        "namespace": namespace,
        "service": service,
        "service_account": service_account,
        "output_dir": str(files.folder),
        "csr_pem": identity.csr_for(key, f"{namespace}/{service}").decode(),
    }
    token = onboarding_token(token_file)
    result = mesh.call(INJECTOR, "POST", "/v1/bootstrap", auth=True, bearer=token, json=body)
    document, answered = result["bootstrap"], result["files"]
    try:
        install(
            files,
            Certificates(
                key_pem,
                answered["cert_chain_pem"].encode(),
                answered["workload_cert_chain_pem"].encode(),
                answered["trust_bundle_pem"].encode(),
            ),
        )
        # last: a folder with bootstrap.json in it is complete
        write_file(files.bootstrap, json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise CliError(f"cannot write the workload's files in {files.folder}: {exc}") from exc
    written = {
        "bootstrap": str(files.bootstrap),
        "proxy_cert": str(files.proxy_cert),
        "proxy_key": str(files.proxy_key),
        "cert": str(files.cert),
        "key": str(files.key),
        "ca": str(files.ca),
    }
    if as_json:
        output.emit_json(
            {
                "common_name": result["common_name"],
                "xds_address": result["xds_address"],
                "bootstrap": document,
                "files": written,
            }
        )
        return
    account = service_account or service
    click.echo(
        f"onboarded proxyless workload {result['common_name']} ({namespace}/{service}, "
        f"service account {account})"
    )
    click.echo(f"wrote {', '.join(written.values())} (keys 0600)")
    click.echo("keep the certificates renewed, and point gRPC at the bootstrap:")
    click.echo(f"  trellis grpc agent --out {shlex.quote(str(files.folder))} &")
    click.echo(f"  export GRPC_XDS_BOOTSTRAP={shlex.quote(str(files.bootstrap))}")
    click.echo("then dial xds:///<service>.<namespace>:<port> with grpc.xds_channel_credentials")


@grpc_group.command(
    help="Keep a proxyless workload's certificates (DIR/proxy-cert.pem, cert.pem, their key "
    "and ca.pem) renewed: once 2/3 of the lifetime has passed, a new key is made here and only "
    "a CSR is sent to proxy-cp, authenticated by the current proxy certificate; both "
    "certificates are replaced together. Runs until stopped; retries with backoff."
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="The folder `trellis grpc bootstrap` wrote.",
)
@click.option("--renew-now", is_flag=True, help="Renew once at start, whatever the lifetime.")
def agent(out: Path, renew_now: bool) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    watch(GrpcFolder(out.resolve()), force_first=renew_now)
