"""Reaching a running mesh's admin APIs from the CLI.

Addresses come from the state directory (``<state-dir>/services/<name>.json``, written by
each service when it is up), else the default ports. The admin token comes from
``TRELLIS_ADMIN_TOKEN`` or ``<state-dir>/admin-token``. Errors name the service, the
address tried and what to do.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import httpx

from trellis_common import statefile, tokens
from trellis_common.settings import Ports

DEFAULT_ADMIN_PORTS = {
    "catalog": Ports.CATALOG[1],
    "certmanager": Ports.CERTMANAGER[1],
    "endpoints-k8s": Ports.ENDPOINTS_K8S[1],
    "endpoints-vm": Ports.ENDPOINTS_VM[1],
    "proxy-cp": Ports.PROXY_CP[1],
    "injector": Ports.INJECTOR_ADMIN,
}


class CliError(click.ClickException):
    """A failure to show the user as one clear line (exit code 1)."""


@dataclass(frozen=True)
class Mesh:
    state_dir: Path

    def admin_url(self, service: str) -> str:
        endpoint = statefile.read_endpoint(self.state_dir, service)
        if endpoint is not None:
            return endpoint.admin_url
        return f"http://127.0.0.1:{DEFAULT_ADMIN_PORTS[service]}"

    def token(self) -> str | None:
        configured = os.environ.get("TRELLIS_ADMIN_TOKEN")
        if configured:
            return configured
        path = tokens.token_path(self.state_dir)
        return path.read_text().strip() if path.exists() else None

    def request(
        self, service: str, method: str, path: str, *, auth: bool = False, **kwargs: Any
    ) -> httpx.Response:
        url = self.admin_url(service) + path
        headers = {}
        if auth:
            token = self.token()
            if token is None:
                raise CliError(
                    f"no admin token: set TRELLIS_ADMIN_TOKEN or run where "
                    f"{tokens.token_path(self.state_dir)} exists (--state-dir)"
                )
            headers["Authorization"] = f"Bearer {token}"
        try:
            response = httpx.request(method, url, headers=headers, timeout=10.0, **kwargs)
        except httpx.TransportError as exc:
            raise CliError(
                f"{service} is not reachable at {url} ({exc.__class__.__name__}); "
                f"is the mesh running? (`make run`, or --state-dir to point at it)"
            ) from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise CliError(f"{service} answered {response.status_code}: {detail}")
        return response

    def get_json(self, service: str, path: str, **kwargs: Any) -> Any:
        return self.request(service, "GET", path, **kwargs).json()
