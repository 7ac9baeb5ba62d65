"""The API server without the ``kubernetes`` package, for the kubeconfigs most people have.

Importing ``kubernetes`` costs 0.7-1.0 s (its package imports every API model), more than a
whole cluster command should take. What the CLI asks of the API server is small: a few GETs
as JSON, and port-forwards. So a kubeconfig whose user is a bearer token (``token``,
``tokenFile``), a client certificate (``client-certificate[-data]`` with its key) or nobody
is read here, and its requests go over httpx, the port-forwards over ``websocket-client``
(the websocket library the ``kubernetes`` package itself uses). A kubeconfig that needs more
(an ``exec`` credential plugin, an ``auth-provider``, a username and password) gives
:func:`load` ``None``, and :mod:`trellis_cli.cluster` uses the ``kubernetes`` package.

A client key given inline (``client-key-data``) is handed to OpenSSL through an anonymous
memory file (``memfd``), never written to disk.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from trellis_cli.errors import CliError

#: The port-forward subprotocol: per forwarded port a data channel (0) and an error channel
#: (1); each frame starts with its channel's byte, and each channel's first frame is the port.
PORTFORWARD_PROTOCOL = "v4.channel.k8s.io"
#: User fields this module cannot honour: the ``kubernetes`` package takes those kubeconfigs.
NEEDS_THE_PACKAGE = ("exec", "auth-provider", "username", "password")


@dataclass(frozen=True)
class KubeLite:
    """One API server: its URL, the TLS context to reach it, and the bearer token."""

    server: str
    context: ssl.SSLContext | None
    token: str | None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self) -> httpx.Client:
        verify: ssl.SSLContext | bool = self.context if self.context is not None else False
        return httpx.Client(base_url=self.server, verify=verify, headers=self.headers())

    def portforward(self, path: str, port: int) -> Any:
        """A websocket to ``path`` (a pod's ``portforward``) for ``port``: the caller relays
        with :func:`relay`."""
        import websocket  # websocket-client: only a command that forwards a port needs it

        url = self.server.replace("https://", "wss://", 1).replace("http://", "ws://", 1)
        sslopt = {"context": self.context} if self.context is not None else {}
        return websocket.create_connection(
            f"{url}{path}?ports={port}",
            header=[f"{k}: {v}" for k, v in self.headers().items()],
            subprotocols=[PORTFORWARD_PROTOCOL],
            sslopt=sslopt,
            timeout=10,
        )


def _named(items: list[dict[str, Any]] | None, name: str, what: str, path: Path) -> Any:
    for item in items or []:
        if item.get("name") == name:
            return item.get(what) or {}
    raise CliError(f"kubeconfig {path}: no {what} named {name!r}")


def _bytes(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    """``key-data`` (base64) or the file ``key`` (relative to the kubeconfig's folder)."""
    inline = entry.get(f"{key}-data")
    if inline:
        try:
            return base64.b64decode(inline, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise CliError(f"{key}-data is not base64: {exc}") from exc
    named = entry.get(key)
    return (base / named).read_bytes() if named else None


def load(path: Path, context: str | None) -> KubeLite | None:
    """The API server of ``context`` (else the current one) in the kubeconfig at ``path``;
    ``None`` when its user needs the ``kubernetes`` package (module docstring)."""
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise CliError(f"kubeconfig {path}: {exc}") from exc
    name = context or config.get("current-context")
    if not name:
        raise CliError(f"kubeconfig {path}: no current-context, and no --context given")
    chosen = _named(config.get("contexts"), name, "context", path)
    cluster = _named(config.get("clusters"), chosen.get("cluster"), "cluster", path)
    user = _named(config.get("users"), chosen["user"], "user", path) if chosen.get("user") else {}
    if any(user.get(field) for field in NEEDS_THE_PACKAGE):
        return None
    server = str(cluster.get("server") or "").rstrip("/")
    if not server.startswith(("https://", "http://")):
        raise CliError(f"kubeconfig {path}: cluster server {server!r} is not an http(s) URL")
    base = path.parent
    try:
        token = user.get("token") or (
            (base / user["tokenFile"]).read_text().strip() if user.get("tokenFile") else None
        )
        tls = _context(cluster, user, base) if server.startswith("https://") else None
    except (OSError, ssl.SSLError) as exc:
        raise CliError(f"kubeconfig {path}: {exc}") from exc
    return KubeLite(server, tls, token)


def _context(cluster: dict[str, Any], user: dict[str, Any], base: Path) -> ssl.SSLContext:
    authority = _bytes(cluster, "certificate-authority", base)
    context = (
        ssl.create_default_context(cadata=authority.decode())
        if authority
        else ssl.create_default_context()
    )
    if cluster.get("insecure-skip-tls-verify"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if cluster.get("tls-server-name"):
        raise OSError("tls-server-name is not supported here")  # the package's, then
    certificate = _bytes(user, "client-certificate", base)
    key = _bytes(user, "client-key", base)
    if certificate and key:
        with _memory_file(certificate) as cert_path, _memory_file(key) as key_path:
            context.load_cert_chain(cert_path, key_path)
    return context


@contextlib.contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    """An anonymous in-memory file holding ``data``, as a path OpenSSL can open."""
    fd = os.memfd_create("trellis-kubeconfig", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def relay(forward: Any, local: socket.socket) -> None:
    """Relay one forwarded port's bytes between the websocket and ``local``, until either
    side closes. Each channel's first frame (the port, 2 bytes) is not data; anything on
    the error channel after it ends the relay."""
    seen = {0: False, 1: False}

    def inbound() -> None:
        try:
            while True:
                frame = forward.recv()
                if not isinstance(frame, bytes) or not frame:
                    return
                channel, payload = frame[0], frame[1:]
                if channel in seen and not seen[channel]:
                    seen[channel] = True
                    payload = payload[2:]  # the port
                if channel == 1 and payload:
                    return  # the API server reports an error for the port
                if channel == 0 and payload:
                    local.sendall(payload)
        except Exception:  # noqa: BLE001  # the websocket or the local side closed
            return
        finally:
            with contextlib.suppress(OSError):
                local.shutdown(socket.SHUT_RDWR)  # ends the other direction's recv

    reader = threading.Thread(target=inbound, daemon=True)
    reader.start()
    try:
        while data := local.recv(65536):
            forward.send_binary(b"\x00" + data)
    except Exception:  # noqa: BLE001  # either side closed
        return
    finally:
        forward.close()
        reader.join(5)
