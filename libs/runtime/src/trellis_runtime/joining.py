"""How a component gets its first certificate: the join exchange with certmanager.

The component makes its key, then sends certmanager ``POST /v1/join`` over TLS with a CSR
and a token that says which component it is: the join token ``trellis up`` left in the
state directory (:mod:`trellis_identity.jointoken`), or in Kubernetes the pod's projected
ServiceAccount token (``service_account_token_file``), which certmanager checks with
TokenReview. certmanager answers with the certificate of
``spiffe://<td>/ns/trellis-system/sa/<component>``. A token works once.

The component trusts certmanager's server certificate against the trust bundle file
(``trust_bundle_file``: written by certmanager in the state directory, or mounted from a
ConfigMap in Kubernetes), and checks it names certmanager. Where certmanager is comes from
the registry (or ``certmanager_admin_address``). Until certmanager answers, the component
waits with backoff (the token lasts ten minutes); a refused token ends the process with
the reason, since retrying it cannot help.

The exchange is one POST, made with the standard library's ``http.client`` on a worker
thread: a service has no other use for an HTTP client, and httpx with httpcore cost every
service start about 0.15 s of CPU to import for this one request.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import socket
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import redis.asyncio

from trellis_common import backoff, components
from trellis_identity import jointoken
from trellis_identity.identity import (
    ComponentIdentity,
    Issued,
    Material,
    Renew,
    client_context,
    csr_for,
    new_key,
)
from trellis_runtime.registry import discover

log = logging.getLogger(__name__)

JOIN_PATH = "/v1/join"
JOIN_BACKOFF = backoff.Backoff(initial=0.1, maximum=2.0)


class JoinRefused(RuntimeError):
    """certmanager refused the token (or the CSR); the message is certmanager's reason."""


class NoJoinToken(RuntimeError):
    """Neither a join token nor a ServiceAccount token is there to join with."""


def read_token(token_file: Path, service_account_token_file: Path | None) -> str:
    if token_file.exists():
        return jointoken.take_token(token_file)
    if service_account_token_file is not None and service_account_token_file.exists():
        return service_account_token_file.read_text().strip()
    where = f"{token_file}" + (
        f" nor {service_account_token_file}" if service_account_token_file else ""
    )
    raise NoJoinToken(
        f"no join token: neither {where} exists (`trellis up` writes one before it starts "
        "each service; by hand: `trellis join-token <component>`)"
    )


async def wait_for_file(path: Path, stop: asyncio.Event, what: str) -> bytes | None:
    """The contents of ``path`` once it exists; ``None`` if ``stop`` came first."""
    logged = False
    async for attempt in backoff.retrying(stop, JOIN_BACKOFF, on=FileNotFoundError):
        with attempt:
            return path.read_bytes()
        if not logged:
            log.info("join.waiting what=%s path=%s", what, path)
            logged = True
    return None


async def certmanager_url(redis_client: redis.asyncio.Redis, configured: str) -> str:
    if configured:
        return f"https://{configured}"
    found = await discover(redis_client, components.CERTMANAGER)
    if not found:
        raise ConnectionError("no live certmanager in the service registry")
    return f"https://{max(found, key=lambda r: r.started_at).admin_address}"


class _Connection(http.client.HTTPSConnection):
    """HTTPS to an address, checking the certificate for another name (certmanager's),
    which it also sends as SNI: the registry gives an address, not a name."""

    def __init__(self, address: str, port: int, context: ssl.SSLContext, name: str) -> None:
        super().__init__(address, port, context=context, timeout=10)
        self._tls = context
        self._name = name

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self._name)


def _post(url: str, context: ssl.SSLContext, body: bytes) -> tuple[int, bytes]:
    target = urlsplit(url)
    connection = _Connection(
        target.hostname or "", target.port or 443, context,
        components.server_name(components.CERTMANAGER),
    )  # fmt: skip
    try:
        connection.request("POST", target.path, body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


async def exchange(url: str, trust_bundle_pem: bytes, token: str, csr_pem: bytes) -> Issued:
    """One ``POST /v1/join``; :class:`JoinRefused` on a 4xx, ``OSError`` (a connection that
    failed) or :class:`http.client.HTTPException` (an answer that is not HTTP) otherwise."""
    body = json.dumps({"token": token, "csr_pem": csr_pem.decode()}).encode()
    context = client_context(trust_bundle_pem)
    status, raw = await asyncio.to_thread(_post, url + JOIN_PATH, context, body)
    if 400 <= status < 500:
        text = raw.decode(errors="replace")
        try:
            reason = json.loads(text).get("detail", text)
        except (ValueError, AttributeError):
            reason = text
        raise JoinRefused(f"certmanager refused to join: {status} {reason}")
    if status >= 300:
        raise http.client.HTTPException(f"certmanager answered {status} to {url}{JOIN_PATH}")
    answer = json.loads(raw)
    return Issued(answer["cert_chain_pem"].encode(), answer["trust_bundle_pem"].encode())


async def join(
    component: str,
    redis_client: redis.asyncio.Redis,
    *,
    token_file: Path,
    trust_bundle_file: Path,
    service_account_token_file: Path | None,
    certmanager_address: str,
    renew: Renew,
    stop: asyncio.Event,
) -> ComponentIdentity | None:
    """Join the mesh as ``component``; ``None`` if ``stop`` came first."""
    token = read_token(token_file, service_account_token_file)
    bundle = await wait_for_file(trust_bundle_file, stop, "trust bundle")
    if bundle is None:
        return None
    key_pem, key = new_key()
    csr = csr_for(key, component)

    def report(state: backoff.RetryCallState) -> None:
        log.info(
            "join.retrying component=%s attempt=%d error=%r",
            component,
            state.attempt_number,
            str(backoff.failure(state)),
        )

    async for attempt in backoff.retrying(
        stop,
        JOIN_BACKOFF,
        on=(http.client.HTTPException, OSError),
        before_sleep=report,
    ):
        with attempt:
            url = await certmanager_url(redis_client, certmanager_address)
            issued = await exchange(url, bundle, token, csr)
            identity = ComponentIdentity(component, Material.of(issued, key_pem), renew)
            log.info(
                "join.done component=%s identity=%s not_after=%s",
                component,
                identity.material.spiffe_id,
                identity.material.leaf.not_valid_after_utc.isoformat(),
            )
            return identity
    return None
