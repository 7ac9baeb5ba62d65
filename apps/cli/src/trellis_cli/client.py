"""Reaching a running mesh's admin APIs from the CLI.

Addresses come from the state directory (``<state-dir>/services/<name>.json``, written by
each service when it is up), else the default ports. The admin token comes from
``TRELLIS_ADMIN_TOKEN`` or ``<state-dir>/admin-token``. Errors name the service, the
address tried and what to do, and carry their exit code (:mod:`trellis_cli.errors`). A
service run as replicas (``trellis up --replicas``) is tried replica after replica while
one refuses the connection, as a Service would pick another pod.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from trellis_cli import errors
from trellis_cli.errors import CliError
from trellis_common import statefile
from trellis_common.defaults import Ports
from trellis_identity import tokens
from trellis_runtime import adminhttp

DEFAULT_ADMIN_PORTS = {
    "catalog": Ports.CATALOG[1],
    "certmanager": Ports.CERTMANAGER[1],
    "endpoints-k8s": Ports.ENDPOINTS_K8S[1],
    "endpoints-vm": Ports.ENDPOINTS_VM[1],
    "proxy-cp": Ports.PROXY_CP[1],
    "injector": Ports.INJECTOR_ADMIN,
}


__all__ = ["DEFAULT_ADMIN_PORTS", "CliError", "Mesh"]


class _Unreachable(Exception):
    """No instance of a service could be reached: the last address tried and why."""

    def __init__(self, url: str, error: httpx.TransportError) -> None:
        super().__init__(url)
        self.url = url
        self.error = error


@dataclass(frozen=True)
class Mesh:
    state_dir: Path

    def admin_url(self, service: str) -> str:
        endpoint = statefile.read_endpoint(self.state_dir, service)
        if endpoint is not None:
            return endpoint.admin_url
        return f"https://127.0.0.1:{DEFAULT_ADMIN_PORTS[service]}"

    def token(self) -> str | None:
        configured = os.environ.get("TRELLIS_ADMIN_TOKEN")
        if configured:
            return configured
        path = tokens.token_path(self.state_dir)
        return path.read_text().strip() if path.exists() else None

    def request(
        self,
        service: str,
        method: str,
        path: str,
        *,
        auth: bool = False,
        bearer: str | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """``auth``: send the admin token (a GET sends it whenever it is known: listings
        need it); ``bearer``: send this token instead (an onboarding or heartbeat token)."""
        headers = {}
        if bearer is not None:
            headers["Authorization"] = f"Bearer {bearer}"
        elif auth or method == "GET":  # listings need the admin token too
            token = self.token()
            if token is None and auth:
                raise CliError(
                    f"no admin token: set TRELLIS_ADMIN_TOKEN or run where "
                    f"{tokens.token_path(self.state_dir)} exists (--state-dir)"
                )
            if token is not None:
                headers["Authorization"] = f"Bearer {token}"
        try:
            response = self._first_answer(service, method, path, headers, kwargs)
        except FileNotFoundError as exc:
            raise CliError(
                f"no trust bundle at {exc.filename}: certmanager writes it when it starts; "
                f"is --state-dir (now {self.state_dir}) the mesh's?"
            ) from exc
        except _Unreachable as down:
            raise self.unreachable(service, down.url, down.error) from down.error
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except (ValueError, AttributeError):
                detail = response.text
            raise errors.for_status(
                service, response.status_code, str(detail), token_sent=bearer is not None
            )
        return response

    def _first_answer(
        self,
        service: str,
        method: str,
        path: str,
        headers: dict[str, str],
        kwargs: dict[str, Any],
    ) -> httpx.Response:
        """The answer of ``service``, or of its next replica (``trellis up --replicas``)
        when one cannot be connected to: a refused connection delivered nothing, so the
        request is safe to send again, as through a Service's other pods. Any other failure
        (a timeout, a reset midway) is the caller's to see."""
        names = self.instances(service) if service in DEFAULT_ADMIN_PORTS else [service]
        for position, name in enumerate(names):
            url = self.admin_url(name) + path
            try:
                return adminhttp.request(
                    self.state_dir, name, method, url, headers=headers, timeout=10.0, **kwargs
                )
            except httpx.ConnectError as exc:
                if position == len(names) - 1:
                    raise _Unreachable(url, exc) from exc
            except httpx.TransportError as exc:
                raise _Unreachable(url, exc) from exc
        raise AssertionError("instances() always names the service itself")

    def unreachable(self, service: str, url: str, error: httpx.TransportError) -> CliError:
        """The error for ``service`` not answering at ``url``: where to look (a cluster's
        mesh, :class:`~trellis_cli.cluster.ClusterMesh`, names its namespace instead)."""
        return errors.unreachable(service, url, error, self.state_dir)

    def call(self, service: str, method: str, path: str, **kwargs: Any) -> Any:
        """The JSON body of a successful answer."""
        response = self.request(service, method, path, **kwargs)
        try:
            return response.json()
        except ValueError as exc:
            raise CliError(
                f"{service} at {response.url} answered {response.status_code} with something "
                f"that is not JSON; is --state-dir (now {self.state_dir}) pointing at a "
                "Trellis mesh?"
            ) from exc

    def get_json(self, service: str, path: str, **kwargs: Any) -> Any:
        return self.call(service, "GET", path, **kwargs)

    def instances(self, service: str) -> list[str]:
        """``service`` and its running replicas (``proxy-cp-2``...), as they advertised
        themselves in the state directory."""
        known = statefile.read_endpoints(self.state_dir)
        replicas = sorted(
            (n for n in known if n != service and n.rpartition("-")[0] == service),
            key=lambda n: int(n.rpartition("-")[2]) if n.rpartition("-")[2].isdigit() else 0,
        )
        return [service, *replicas]
