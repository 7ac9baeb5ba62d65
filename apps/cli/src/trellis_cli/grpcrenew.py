"""A proxyless gRPC workload's own certificates, written and renewed in its folder.

A proxyless workload has no Envoy and no pod agent, so ``trellis grpc agent`` does their
work for it. Its folder (:class:`~trellis_common.grpc_bootstrap.GrpcFolder`) holds one key,
made on this host, and two certificates for it: the proxy certificate (the xDS channel's
client certificate, clientAuth only) and the workload certificate (its service account's
SPIFFE id, for calls to and from other workloads). No key of the whole service is ever
sent to it.

:func:`install` writes a version of the folder the way the kubelet writes a Secret volume
(:mod:`.swapdir`: one ``rename`` of ``..data``), so gRPC's ``file_watcher`` (which re-reads
the files every :data:`~trellis_common.grpc_bootstrap.REFRESH_INTERVAL`) never reads a key
of one version with a certificate of another. :func:`renew` makes a new key here and sends
only a CSR to ``trellis.proxy.v1.ProxyCertificates/Renew`` on proxy-cp's xDS port,
authenticated by the current proxy certificate (mTLS); the answer carries both new
certificates and the trust bundle, and certmanager revokes the old serial. :func:`watch`
renews whenever 2/3 of the lifetime has passed, retrying failures with backoff, forever.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import grpc
from cryptography import x509

from trellis_api import proxy_pb2
from trellis_cli import swapdir
from trellis_cli.errors import CliError
from trellis_cli.renew import ask_renewal, renew_at
from trellis_common import components
from trellis_common.grpc_bootstrap import (
    CA_FILE,
    CERT_FILE,
    KEY_FILE,
    PROXY_CERT_FILE,
    PROXY_KEY_FILE,
    GrpcFolder,
)
from trellis_identity import servercheck

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Certificates:
    """One version of the folder: the key made here, and what proxy-cp answered for it."""

    key_pem: bytes
    proxy_cert_chain_pem: bytes
    workload_cert_chain_pem: bytes
    trust_bundle_pem: bytes


def install(files: GrpcFolder, version: Certificates) -> None:
    """Write ``version``: both certificates, the key under both names (gRPC's channel
    credentials and its certificate provider each read a pair), and the trust bundle."""
    swapdir.install(
        files.folder,
        {
            PROXY_KEY_FILE: version.key_pem,
            PROXY_CERT_FILE: version.proxy_cert_chain_pem,
            KEY_FILE: version.key_pem,
            CERT_FILE: version.workload_cert_chain_pem,
            CA_FILE: version.trust_bundle_pem,
        },
        private=(PROXY_KEY_FILE, KEY_FILE),
    )


def read_bootstrap(files: GrpcFolder) -> dict[str, Any]:
    try:
        body: dict[str, Any] = json.loads(files.bootstrap.read_text())
        body["xds_servers"][0]["server_uri"]
        body["node"]["id"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise CliError(
            f"{files.bootstrap} is not a bootstrap of `trellis grpc bootstrap`: {exc!r}"
        ) from None
    return body


def proxy_certificate(files: GrpcFolder) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(files.proxy_cert.read_bytes())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the proxy certificate {files.proxy_cert}: {exc}") from None


def check_proxy_cp(
    target: str, workload: x509.Certificate, trust: bytes, cert_pem: bytes, key_pem: bytes
) -> None:
    """proxy-cp at ``target`` must present proxy-cp's SPIFFE id in the workload's trust
    domain (gRPC itself checks only the host name), before a CSR is sent."""
    ids = servercheck.spiffe_ids(workload)
    if not ids:
        raise CliError("the workload certificate carries no SPIFFE id: bootstrap it again")
    trust_domain = ids[0].removeprefix("spiffe://").split("/", 1)[0]
    expected = components.spiffe_id(trust_domain, components.PROXY_CP).uri
    try:
        host, _ = servercheck.target(target)
        servercheck.verify_server(target, host, expected, trust, cert_pem, key_pem)
    except (servercheck.ServerRefused, servercheck.Unreachable, ValueError) as exc:
        raise CliError(f"{target} is not proxy-cp, or not reachable: {exc}") from None


def renew(files: GrpcFolder, timeout: float = 30.0) -> proxy_pb2.RenewResponse:
    """Renew now: a new key here, its CSR to proxy-cp (mTLS with the current proxy
    certificate, proxy-cp checked for the bootstrap's host), the new version installed."""
    target = read_bootstrap(files)["xds_servers"][0]["server_uri"]
    try:
        trust, key_pem_now, cert_now = (
            files.ca.read_bytes(),
            files.proxy_key.read_bytes(),
            files.proxy_cert.read_bytes(),
        )
        workload = x509.load_pem_x509_certificate(files.cert.read_bytes())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the workload's files in {files.folder}: {exc}") from None
    check_proxy_cp(target, workload, trust, cert_now, key_pem_now)
    credentials = grpc.ssl_channel_credentials(trust, key_pem_now, cert_now)
    answer, key_pem = ask_renewal(target, credentials, [], timeout)
    install(
        files,
        Certificates(
            key_pem,
            answer.cert_chain_pem,
            answer.workload_cert_chain_pem,
            answer.trust_bundle_pem,
        ),
    )
    return answer


def watch(files: GrpcFolder, max_backoff: float = 60.0, force_first: bool = False) -> None:
    """``trellis grpc agent``: renew whenever due, forever; failures retried with backoff
    (and logged with the certificate's expiry, so a renewal that keeps failing is seen
    before the certificates lapse)."""
    read_bootstrap(files)  # a folder that is not a workload's fails at once
    backoff, force = 1.0, force_first
    while True:
        try:
            due = renew_at(proxy_certificate(files))
            wait = 0.0 if force else (due - dt.datetime.now(dt.UTC)).total_seconds()
            if wait > 0:
                log.info("grpc_agent.waiting dir=%s renew_at=%s", files.folder, due.isoformat())
                time.sleep(wait)
            answer = renew(files)
            force, backoff = False, 1.0
            log.info(
                "grpc_agent.renewed dir=%s serial=%s not_after=%s",
                files.folder,
                answer.serial,
                answer.not_after.ToDatetime(dt.UTC).isoformat(),
            )
        except CliError as exc:
            try:
                expires = proxy_certificate(files).not_valid_after_utc.isoformat()
            except CliError:
                expires = "-"
            log.warning(
                "grpc_agent.failed dir=%s reason=%r retry_in=%.0fs not_after=%s",
                files.folder,
                str(exc),
                backoff,
                expires,
            )
            time.sleep(backoff)
            backoff = min(backoff * 2, max_backoff)
