"""Calling a component's admin REST API over TLS, as the CLI and tools do.

Every admin API is served over TLS with the component's certificate. A client checks it
against the mesh's trust bundle (``<state-dir>/trust-bundle.pem``, which certmanager
writes) and, by default, that it names the component it meant to reach
(``<component>.trellis-system.svc``, sent as SNI whatever the address), so a process on
another port cannot pose as certmanager to the CLI. ``check_name=False`` checks only that
the certificate is the mesh's (readiness probes that do not know the component).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx

from trellis_common import components
from trellis_common.defaults import TRUST_BUNDLE_FILE
from trellis_identity import tokens
from trellis_identity.trustctx import client_context, system_context


def trust_bundle_path(state_dir: Path) -> Path:
    return state_dir / TRUST_BUNDLE_FILE


def mesh_context(state_dir: Path, *, check_name: bool = True) -> ssl.SSLContext:
    """Verifies servers against the mesh's trust bundle; ``OSError`` if there is none yet."""
    context = client_context(trust_bundle_path(state_dir).read_bytes())
    context.check_hostname = check_name
    return context


def request(
    state_dir: Path,
    component: str,
    method: str,
    url: str,
    *,
    client: httpx.Client | None = None,
    **kwargs: Any,
) -> httpx.Response:
    """One request to ``component``'s admin API at ``url`` (plain ``http://`` is sent as is);
    a replica's instance name (``proxy-cp-2``) stands for its component. A ``GET`` without
    an ``Authorization`` header carries the admin token of ``state_dir`` when there is one:
    listings need it; other methods send only what the caller gives. ``client``: one made
    with :func:`mesh_context` whose open connection to the component is reused (else a
    connection of its own, closed after)."""
    timeout = kwargs.pop("timeout", 10.0)
    headers = dict(kwargs.pop("headers", None) or {})
    token = tokens.token_path(state_dir)
    if method == "GET" and "Authorization" not in headers and token.exists():
        headers["Authorization"] = f"Bearer {token.read_text().strip()}"
    kwargs["headers"] = headers
    if not url.startswith("https://"):
        return httpx.request(method, url, timeout=timeout, verify=system_context(), **kwargs)
    extensions = {"sni_hostname": components.server_name(components.of_instance(component))}
    if client is not None:
        return client.request(method, url, extensions=extensions, timeout=timeout, **kwargs)
    with httpx.Client(verify=mesh_context(state_dir), timeout=timeout) as own:
        return own.request(method, url, extensions=extensions, **kwargs)
