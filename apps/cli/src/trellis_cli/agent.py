"""``trellis-agent``: a pod's proxy gets its identity by CSR, as Istio's agent does.

The injector adds this agent to every injected pod, as a native sidecar (an init container
with ``restartPolicy: Always``) from the Trellis image, running as the proxy's uid (whose
traffic the pod's redirect lets out), before Envoy starts. The agent:

1. makes the proxy's key, here in the pod's memory-backed volume (it never leaves);
2. proves who the pod is with its projected ServiceAccount token (audience ``trellis``,
   bound to the pod by the kubelet), sent with a CSR to proxy-cp's enrollment port
   (``trellis.proxy.v1.ProxyEnrollment/Enroll``; server TLS, proxy-cp's certificate checked
   against the mesh root the injector gave it, for its DNS name and for the SPIFFE id the
   bootstrap accepts it by, before the token is sent);
3. gets back the proxy certificate (Envoy's xDS client certificate, CN
   ``<pod-uid>.<service>.<namespace>``) and the workload certificate (its ServiceAccount's
   SPIFFE id, for mesh mTLS), both for that key;
4. writes them, with the key and the trust bundle, to its folder the way the kubelet
   writes a Secret volume: into a fresh ``..<time>`` folder, then one ``rename`` of the
   ``..data`` link, so Envoy (which watches the folder) reloads key and certificates
   together, never half; then, the first time, Envoy's bootstrap (``envoy.yaml``, the
   injector's, with the node id the proxy certificate names), which the startup probe
   waits for;
5. renews all of it (a new key, the kubelet's current token) once half the lifetime has
   passed, retrying failures with backoff, and logs when the certificates are about to
   expire without a renewal.

Configuration is by environment (the injector sets it): ``TRELLIS_AGENT_ADDRESS``
(``host:port``), ``TRELLIS_AGENT_SERVER_NAME`` (the name proxy-cp's certificate is checked
for), ``TRELLIS_AGENT_CA`` (PEM), ``TRELLIS_AGENT_SERVICE``, ``TRELLIS_AGENT_TOKEN``
(the token's path), ``TRELLIS_AGENT_DIR``, ``TRELLIS_AGENT_BOOTSTRAP`` (the bootstrap's
YAML) and ``TRELLIS_AGENT_RENEW_FRACTION`` (0.5). No key or token is ever logged.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import yaml
from cryptography import x509

from trellis_api import proxy_pb2, proxy_pb2_grpc
from trellis_cli.swapdir import install
from trellis_common.bootstrap import (
    CA_FILE,
    KEY_FILE,
    PROXY_CERT_FILE,
    SDS_FILE,
    WORKLOAD_CERT_FILE,
    proxy_secret_document,
    xds_server_identity,
)
from trellis_identity import identity, servercheck

log = logging.getLogger("trellis.agent")

BOOTSTRAP_FILE = "envoy.yaml"


class AgentError(Exception):
    """Enrollment failed; the message says why (never with a key or token)."""


@dataclass(frozen=True, slots=True)
class AgentConfig:
    address: str
    server_name: str
    ca_pem: bytes
    service: str
    token_path: Path
    folder: Path
    bootstrap: str
    renew_fraction: float = 0.5

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> AgentConfig:
        missing = [
            name
            for name in ("ADDRESS", "SERVER_NAME", "CA", "SERVICE", "DIR", "BOOTSTRAP")
            if not environ.get(f"TRELLIS_AGENT_{name}")
        ]
        if missing:
            names = ", ".join(f"TRELLIS_AGENT_{name}" for name in missing)
            raise AgentError(f"missing configuration: {names} (the injector sets them)")
        fraction = float(environ.get("TRELLIS_AGENT_RENEW_FRACTION", "0.5"))
        if not 0 < fraction < 1:
            raise AgentError(f"TRELLIS_AGENT_RENEW_FRACTION: {fraction} is not in (0, 1)")
        return cls(
            address=environ["TRELLIS_AGENT_ADDRESS"],
            server_name=environ["TRELLIS_AGENT_SERVER_NAME"],
            ca_pem=environ["TRELLIS_AGENT_CA"].encode(),
            service=environ["TRELLIS_AGENT_SERVICE"],
            token_path=Path(environ.get("TRELLIS_AGENT_TOKEN", "/var/run/secrets/trellis/token")),
            folder=Path(environ["TRELLIS_AGENT_DIR"]),
            bootstrap=environ["TRELLIS_AGENT_BOOTSTRAP"],
            renew_fraction=fraction,
        )


@dataclass(frozen=True, slots=True)
class Enrolled:
    key_pem: bytes
    response: proxy_pb2.EnrollResponse

    @property
    def not_after(self) -> dt.datetime:
        return self.response.not_after.ToDatetime(tzinfo=dt.UTC)


def check_server(config: AgentConfig) -> None:
    """proxy-cp must present the SPIFFE id the pod's bootstrap accepts it by, not only a
    certificate of the mesh CA for its DNS name (:mod:`trellis_identity.servercheck`): the
    token is sent only to proxy-cp."""
    try:
        expected = xds_server_identity(yaml.safe_load(config.bootstrap))
    except (yaml.YAMLError, KeyError, IndexError, TypeError, StopIteration) as exc:
        raise AgentError(f"TRELLIS_AGENT_BOOTSTRAP names no proxy-cp identity: {exc!r}") from None
    try:
        servercheck.verify_server(config.address, config.server_name, expected, config.ca_pem)
    except servercheck.ServerRefused as exc:
        raise AgentError(
            f"{config.address} is not proxy-cp ({exc.reason}): {exc}; no token was sent"
        ) from None
    except servercheck.Unreachable as exc:
        raise AgentError(str(exc)) from None


def enroll(config: AgentConfig) -> Enrolled:
    """One enrollment: a new key, its CSR and the pod's token to proxy-cp."""
    try:
        token = config.token_path.read_text().strip()
    except OSError as exc:
        raise AgentError(f"cannot read the token {config.token_path}: {exc}") from None
    check_server(config)
    key_pem, key = identity.new_key()
    csr = identity.csr_for(key, config.service)
    credentials = grpc.ssl_channel_credentials(root_certificates=config.ca_pem)
    options = [("grpc.ssl_target_name_override", config.server_name)]
    with grpc.secure_channel(config.address, credentials, options=options) as channel:
        stub = proxy_pb2_grpc.ProxyEnrollmentStub(channel)
        try:
            response = stub.Enroll(
                proxy_pb2.EnrollRequest(csr_pem=csr, service=config.service),
                metadata=(("authorization", f"Bearer {token}"),),
                timeout=30,
            )
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise AgentError(
                f"proxy-cp at {config.address} refused or failed the enrollment: "
                f"{code.name if code else 'error'}: {details}"
            ) from None
    return Enrolled(key_pem, response)


def bootstrap_with_node(template: str, node_id: str) -> str:
    """The injector's bootstrap with the node id the proxy certificate names."""
    document: Any = yaml.safe_load(template)
    if not isinstance(document, dict) or not isinstance(document.get("node"), dict):
        raise AgentError("TRELLIS_AGENT_BOOTSTRAP is not an Envoy bootstrap with a node")
    document["node"]["id"] = node_id
    return yaml.safe_dump(document, sort_keys=False)


def write_bootstrap(folder: Path, text: str) -> None:
    """``envoy.yaml``, replaced in one rename when it changed (it changes only if the
    node id did: a pod's uid is its node id, so never within a pod's life)."""
    target = folder / BOOTSTRAP_FILE
    if target.exists() and target.read_text() == text:
        return
    temporary = folder / f".{BOOTSTRAP_FILE}.tmp"
    temporary.write_text(text)
    os.replace(temporary, target)


def apply(config: AgentConfig, enrolled: Enrolled) -> None:
    response = enrolled.response
    folder = config.folder
    sds = proxy_secret_document(folder / PROXY_CERT_FILE, folder / KEY_FILE)
    install(
        folder,
        {
            KEY_FILE: enrolled.key_pem,
            PROXY_CERT_FILE: response.proxy_cert_chain_pem,
            WORKLOAD_CERT_FILE: response.workload_cert_chain_pem,
            CA_FILE: response.trust_bundle_pem,
            SDS_FILE: yaml.safe_dump(sds, sort_keys=False).encode(),
        },
    )
    write_bootstrap(folder, bootstrap_with_node(config.bootstrap, response.node_id))


def renew_at(config: AgentConfig, enrolled: Enrolled) -> dt.datetime:
    leaf = x509.load_pem_x509_certificate(enrolled.response.proxy_cert_chain_pem)
    start = leaf.not_valid_before_utc
    return start + (leaf.not_valid_after_utc - start) * config.renew_fraction


def run(config: AgentConfig, stop: threading.Event, max_backoff: float = 30.0) -> None:
    """Enroll, then renew whenever due, until ``stop``; failures retried with backoff."""
    backoff = 1.0
    current: Enrolled | None = None
    while not stop.is_set():
        now = dt.datetime.now(dt.UTC)
        if current is not None:
            due = renew_at(config, current)
            if now < due:
                stop.wait(min((due - now).total_seconds(), 60.0))
                continue
        try:
            current = enroll(config)
            apply(config, current)
            backoff = 1.0
            log.info(
                "agent.enrolled node=%s spiffe=%s not_after=%s renew_at=%s",
                current.response.node_id,
                current.response.spiffe_id,
                current.not_after.isoformat(),
                renew_at(config, current).isoformat(),
            )
        except (AgentError, OSError) as exc:
            expiring = current is not None and current.not_after - now < dt.timedelta(minutes=5)
            log.warning(
                "agent.failed reason=%r retry_in=%.0fs%s",
                str(exc),
                backoff,
                " expires_soon=true" if expiring else "",
            )
            stop.wait(backoff)
            backoff = min(backoff * 2, max_backoff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="trellis-agent",
        description="A pod's Trellis agent: enrolls the proxy with the pod's ServiceAccount "
        "token and keeps its key and certificates renewed (configured by the TRELLIS_AGENT_* "
        "environment the injector sets).",
    )
    parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )
    try:
        config = AgentConfig.from_env(os.environ)
    except (AgentError, ValueError) as exc:
        log.error("agent.misconfigured error=%r", str(exc))
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info(
        "agent.starting address=%s service=%s dir=%s", config.address, config.service, config.folder
    )
    run(config, stop)
    log.info("agent.stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
