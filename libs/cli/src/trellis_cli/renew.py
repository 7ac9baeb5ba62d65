"""``trellis proxy renew``: a proxy's host renews the proxy's certificate before it expires.

Proxy certificates are short-lived (24 h by default). The host that runs the proxy renews
its certificate through proxy-cp, the only endpoint proxies talk to: it makes a new key
here, sends only a CSR to ``trellis.proxy.v1.ProxyCertificates/Renew`` on the xDS port,
authenticated by the proxy's current certificate (mTLS), and gets a certificate of the same
common name back; certmanager revokes the old serial.

Everything needed is read from the proxy's folder (``--dir``, as ``trellis vm bootstrap``
wrote it): ``envoy.yaml`` says where proxy-cp is, its identity and the trust bundle; the
SDS file it names (``proxy-sds.yaml``) says which certificate and key are in use. A new
pair is written under new names (``cert-<serial>.pem``, ``key-<serial>.pem`` 0600), then a
new SDS file is moved into place (one ``rename``): Envoy reloads it and uses the new pair
for its next connection to proxy-cp, with no restart and no traffic lost. The previous
pair is deleted afterwards.

One shot renews once 2/3 of the lifetime has passed (or with ``--force``); ``--watch`` is
the loop for a VM agent: it sleeps until that point, renews, and retries failures with
backoff (never past the certificate's expiry without saying so in its log).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from cryptography import x509

from trellis_api import proxy_pb2, proxy_pb2_grpc
from trellis_cli.errors import CliError
from trellis_common import identity
from trellis_common.bootstrap import PROXY_SECRET, proxy_secret_document

log = logging.getLogger(__name__)

BOOTSTRAP_FILE = "envoy.yaml"
#: Renew once this fraction of the lifetime has passed.
RENEW_FRACTION = 2 / 3
XDS_CLUSTER = "trellis-xds"


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
            spiffe = validation["match_typed_subject_alt_names"][0]["matcher"]["exact"]
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
        return cls(folder, sds, trust_bundle, target, server_name or _dns_name(spiffe))

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


def renew(proxy: ProxyFolder, timeout: float = 30.0) -> Renewed:
    """Renew now: a new key here, a CSR to proxy-cp, the new pair installed."""
    cert_path, key_path = proxy.in_use()
    old = current_certificate(proxy)
    key_pem, key = identity.new_key()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=proxy.trust_bundle.read_bytes(),
        private_key=key_path.read_bytes(),
        certificate_chain=cert_path.read_bytes(),
    )
    options = [("grpc.ssl_target_name_override", proxy.server_name)]
    with grpc.secure_channel(proxy.xds_target, credentials, options=options) as channel:
        stub = proxy_pb2_grpc.ProxyCertificatesStub(channel)
        try:
            answer: proxy_pb2.RenewResponse = stub.Renew(
                proxy_pb2.RenewRequest(csr_pem=identity.csr_for(key, "renewal")), timeout=timeout
            )
        except grpc.RpcError as exc:
            code = exc.code().name if isinstance(exc, grpc.Call) else "UNKNOWN"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise CliError(
                f"proxy-cp at {proxy.xds_target} refused the renewal: {code}: {details}"
            ) from None
    new_cert, new_key = install(proxy, answer.cert_chain_pem, key_pem, answer.serial)
    return Renewed(
        answer.serial,
        f"{old.serial_number:x}",
        answer.not_after.ToDatetime(dt.UTC),
        new_cert,
        new_key,
    )


def _write_new(folder: Path, name: str, data: bytes, mode: int) -> Path:
    """Write ``data`` to ``folder/name`` through a temporary file and a rename (the file is
    never seen half-written; a key is never readable by others, not even for a moment)."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        target = folder / name
        os.replace(tmp, target)
        return target
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install(
    proxy: ProxyFolder, cert_chain_pem: bytes, key_pem: bytes, serial: str
) -> tuple[Path, Path]:
    """The new pair under new names, then the SDS file swapped (Envoy reloads on the move),
    then the previous pair deleted. Returns the new (certificate, key) paths."""
    folder = proxy.sds.parent
    previous = proxy.in_use()
    key = _write_new(folder, f"key-{serial}.pem", key_pem, 0o600)
    cert = _write_new(folder, f"cert-{serial}.pem", cert_chain_pem, 0o644)
    document = yaml.safe_dump(proxy_secret_document(cert, key), sort_keys=False)
    _write_new(folder, proxy.sds.name, document.encode(), 0o644)
    for path in previous:
        if path not in (cert, key):
            path.unlink(missing_ok=True)
    return cert, key


def renew_if_due(proxy: ProxyFolder, force: bool, now: dt.datetime | None = None) -> Renewed | None:
    """Renew if 2/3 of the lifetime has passed (or ``force``); None if not yet due."""
    now = now or dt.datetime.now(dt.UTC)
    if not force and now < renew_at(current_certificate(proxy)):
        return None
    return renew(proxy)


def watch(proxy: ProxyFolder, max_backoff: float = 60.0) -> None:
    """Renew whenever due, forever (until interrupted); failures are retried with backoff."""
    backoff = 1.0
    while True:
        try:
            due = renew_at(current_certificate(proxy))
            wait = (due - dt.datetime.now(dt.UTC)).total_seconds()
            if wait > 0:
                log.info("renew.waiting dir=%s renew_at=%s", proxy.folder, due.isoformat())
                time.sleep(wait)
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
            time.sleep(backoff)
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
