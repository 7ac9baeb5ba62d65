"""``trellis proxy renew``: a proxy's host renews the proxy's certificate before it expires.

Proxy certificates are short-lived (24 h by default). The host that runs the proxy renews
its certificate through proxy-cp, the only endpoint proxies talk to: it makes a new key
here, sends only a CSR to ``trellis.proxy.v1.ProxyCertificates/Renew`` on the xDS port,
authenticated by the proxy's current certificate (mTLS), and gets a certificate of the same
common name back, with the proxy's own workload certificate for the same key; certmanager
revokes the old serial.

Everything needed is read from the proxy's folder (``--dir``, as ``trellis vm bootstrap``
wrote it): ``envoy.yaml`` says where proxy-cp is, its identity and the trust bundle; the
SDS file it names (``proxy-sds.yaml``) says which certificate and key are in use. The new
key (0600), both certificates, the trust bundle and the SDS file are written as one new
version of the folder, the way the kubelet writes a Secret volume (:mod:`.swapdir`: one
``rename`` of ``..data``): Envoy reloads its xDS client certificate and its workload
certificate together, with no restart and no traffic lost.

One shot renews once 2/3 of the lifetime has passed (or with ``--force``); ``--watch`` is
the loop for a VM agent: it sleeps until that point, renews, and retries failures with
backoff (never past the certificate's expiry without saying so in its log).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from cryptography import x509

from trellis_api import proxy_pb2, proxy_pb2_grpc
from trellis_cli import swapdir
from trellis_cli.errors import CliError
from trellis_common.bootstrap import (
    CA_FILE,
    KEY_FILE,
    PROXY_CERT_FILE,
    PROXY_SECRET,
    WORKLOAD_CERT_FILE,
    XDS_CLUSTER,
    proxy_secret_document,
    xds_server_identity,
)
from trellis_identity import identity, servercheck

log = logging.getLogger(__name__)

BOOTSTRAP_FILE = "envoy.yaml"
#: Renew once this fraction of the lifetime has passed.
RENEW_FRACTION = 2 / 3


@dataclass(frozen=True, slots=True)
class ProxyFolder:
    """What the renewer needs to know, read from the proxy's bootstrap."""

    folder: Path
    sds: Path
    trust_bundle: Path
    xds_target: str
    server_name: str
    """The DNS name proxy-cp's certificate is checked for (``<sa>.<namespace>`` of its
    SPIFFE id: the names certmanager gives a control plane component)."""
    server_id: str
    """The SPIFFE id the bootstrap accepts proxy-cp by; checked before any call."""

    @classmethod
    def load(cls, folder: Path, server_name: str = "") -> ProxyFolder:
        path = folder / BOOTSTRAP_FILE
        try:
            bootstrap = yaml.safe_load(path.read_text())
            cluster = next(
                c for c in bootstrap["static_resources"]["clusters"] if c["name"] == XDS_CLUSTER
            )
            address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            socket = address["address"]["socket_address"]
            tls = cluster["transport_socket"]["typed_config"]["common_tls_context"]
            validation = tls["validation_context"]
            spiffe = xds_server_identity(bootstrap)
            trust_bundle = Path(validation["trusted_ca"]["filename"])
        except (OSError, yaml.YAMLError, KeyError, IndexError, StopIteration, TypeError) as exc:
            raise CliError(
                f"{path} is not a proxy bootstrap of `trellis vm bootstrap`: {exc!r}"
            ) from None
        configs = tls.get("tls_certificate_sds_secret_configs") or []
        if not configs:
            raise CliError(
                f"{path} names its certificate files directly (a bootstrap made before renewal "
                f"existed): Envoy would not pick up a renewed certificate without a restart. "
                f"Onboard the proxy again with `trellis vm bootstrap`"
            )
        sds = Path(configs[0]["sds_config"]["path_config_source"]["path"])
        host = str(socket["address"])
        target = (
            f"[{host}]:{socket['port_value']}" if ":" in host else f"{host}:{socket['port_value']}"
        )
        return cls(folder, sds, trust_bundle, target, server_name or _dns_name(spiffe), spiffe)

    def in_use(self) -> tuple[Path, Path]:
        """The certificate and key files the SDS file names."""
        try:
            document = yaml.safe_load(self.sds.read_text())
            secret = next(r for r in document["resources"] if r["name"] == PROXY_SECRET)
            pair = secret["tls_certificate"]
            return Path(pair["certificate_chain"]["filename"]), Path(
                pair["private_key"]["filename"]
            )
        except (OSError, yaml.YAMLError, KeyError, StopIteration, TypeError) as exc:
            raise CliError(f"{self.sds} does not name the proxy's certificate: {exc!r}") from None


def _dns_name(spiffe_id: str) -> str:
    """``spiffe://<td>/ns/<ns>/sa/<sa>`` -> ``<sa>.<ns>``."""
    parts = spiffe_id.removeprefix("spiffe://").split("/")
    if len(parts) != 5 or parts[1] != "ns" or parts[3] != "sa":
        raise CliError(f"proxy-cp's identity {spiffe_id!r} is not a SPIFFE id; use --server-name")
    return f"{parts[4]}.{parts[2]}"


def renew_at(certificate: x509.Certificate) -> dt.datetime:
    """When 2/3 of the certificate's lifetime has passed."""
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    return start + (end - start) * RENEW_FRACTION


@dataclass(frozen=True, slots=True)
class Renewed:
    serial: str
    old_serial: str
    not_after: dt.datetime
    cert_chain: Path
    key: Path


def current_certificate(proxy: ProxyFolder) -> x509.Certificate:
    cert_path, _ = proxy.in_use()
    try:
        return x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the proxy's certificate {cert_path}: {exc}") from None


def ask_renewal(
    target: str,
    credentials: grpc.ChannelCredentials,
    options: list[tuple[str, str]],
    timeout: float,
) -> tuple[proxy_pb2.RenewResponse, bytes]:
    """A new key made here, its CSR to proxy-cp's ``ProxyCertificates/Renew`` over
    ``credentials`` (mTLS with the current proxy certificate); (the answer, the new key's
    PEM). An answer without the proxy's workload certificate is an error: nothing is
    written then."""
    key_pem, key = identity.new_key()
    with grpc.secure_channel(target, credentials, options=options) as channel:
        stub = proxy_pb2_grpc.ProxyCertificatesStub(channel)
        try:
            answer: proxy_pb2.RenewResponse = stub.Renew(
                proxy_pb2.RenewRequest(csr_pem=identity.csr_for(key, "renewal")), timeout=timeout
            )
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise CliError(f"proxy-cp at {target} refused the renewal: {code}: {details}") from None
    if not answer.workload_cert_chain_pem:
        raise CliError(
            f"proxy-cp at {target} renewed the proxy certificate without its workload "
            "certificate (a control plane older than this CLI); nothing was written"
        )
    return answer, key_pem


def renew(proxy: ProxyFolder, timeout: float = 30.0) -> Renewed:
    """Renew now: a new key here, a CSR to proxy-cp, the new pair installed."""
    cert_path, key_path = proxy.in_use()
    old = current_certificate(proxy)
    trust, current_key, current_cert = (
        proxy.trust_bundle.read_bytes(),
        key_path.read_bytes(),
        cert_path.read_bytes(),
    )
    try:  # proxy-cp by its SPIFFE id, not only by a name the mesh CA signed
        servercheck.verify_server(
            proxy.xds_target, proxy.server_name, proxy.server_id, trust, current_cert, current_key
        )
    except (servercheck.ServerRefused, servercheck.Unreachable) as exc:
        raise CliError(f"{proxy.xds_target} is not proxy-cp, or not reachable: {exc}") from None
    credentials = grpc.ssl_channel_credentials(
        root_certificates=trust, private_key=current_key, certificate_chain=current_cert
    )
    options = [("grpc.ssl_target_name_override", proxy.server_name)]
    answer, key_pem = ask_renewal(proxy.xds_target, credentials, options, timeout)
    new_cert, new_key = install(proxy, answer, key_pem)
    return Renewed(
        answer.serial,
        f"{old.serial_number:x}",
        answer.not_after.ToDatetime(dt.UTC),
        new_cert,
        new_key,
    )


def install(
    proxy: ProxyFolder, answer: proxy_pb2.RenewResponse, key_pem: bytes
) -> tuple[Path, Path]:
    """The new key, proxy and workload certificates and trust bundle, and an SDS file
    naming them, swapped in as one version (:mod:`.swapdir`): Envoy reloads the xDS client
    certificate and its own workload certificate together. A folder written before this
    layout (``cert-<serial>.pem`` pairs) is moved to it, and its old pair deleted. Returns
    the (certificate, key) paths in use now."""
    folder = proxy.sds.parent
    previous = proxy.in_use()
    cert, key = folder / PROXY_CERT_FILE, folder / KEY_FILE
    document = yaml.safe_dump(proxy_secret_document(cert, key), sort_keys=False)
    swapdir.install(
        folder,
        {
            KEY_FILE: key_pem,
            PROXY_CERT_FILE: answer.cert_chain_pem,
            WORKLOAD_CERT_FILE: answer.workload_cert_chain_pem,
            CA_FILE: answer.trust_bundle_pem,
            proxy.sds.name: document.encode(),
        },
    )
    for path in previous:
        if path not in (cert, key) and path.parent == folder and not path.is_symlink():
            path.unlink(missing_ok=True)
    return cert, key


def renew_if_due(proxy: ProxyFolder, force: bool, now: dt.datetime | None = None) -> Renewed | None:
    """Renew if 2/3 of the lifetime has passed (or ``force``); None if not yet due."""
    now = now or dt.datetime.now(dt.UTC)
    if not force and now < renew_at(current_certificate(proxy)):
        return None
    return renew(proxy)


def watch(
    proxy: ProxyFolder, max_backoff: float = 60.0, stop: threading.Event | None = None
) -> None:
    """Renew whenever due until ``stop`` is set (without one, until interrupted); failures
    are retried with backoff."""
    stop = stop or threading.Event()
    backoff = 1.0
    while not stop.is_set():
        try:
            due = renew_at(current_certificate(proxy))
            wait = (due - dt.datetime.now(dt.UTC)).total_seconds()
            if wait > 0:
                log.info("renew.waiting dir=%s renew_at=%s", proxy.folder, due.isoformat())
                if stop.wait(wait):
                    return
            done = renew(proxy)
            log.info(
                "renew.renewed dir=%s old_serial=%s serial=%s not_after=%s",
                proxy.folder,
                done.old_serial,
                done.serial,
                done.not_after.isoformat(),
            )
            backoff = 1.0
        except CliError as exc:
            expires = _expiry(proxy)
            log.warning(
                "renew.failed dir=%s reason=%r retry_in=%.0fs not_after=%s",
                proxy.folder,
                str(exc),
                backoff,
                expires,
            )
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff)


def _expiry(proxy: ProxyFolder) -> str:
    try:
        return current_certificate(proxy).not_valid_after_utc.isoformat()
    except CliError:
        return "-"


def describe(done: Renewed) -> dict[str, Any]:
    return {
        "renewed": True,
        "serial": done.serial,
        "old_serial": done.old_serial,
        "not_after": done.not_after.isoformat(),
        "cert_chain": str(done.cert_chain),
        "key": str(done.key),
    }
