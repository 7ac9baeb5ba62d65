"""A tunnel into a pod: a listener on 127.0.0.1 whose every connection is a port-forward
through the Kubernetes API server to one port of the pod, its bytes relayed both ways
(:mod:`trellis_cli.cluster` makes one per component it reaches, :mod:`trellis_cli.dashpods`
one per sidecar it reads). With :mod:`trellis_cli.kubelite` the forward is
websocket-client's; otherwise the ``kubernetes`` package's, imported on first use.
"""

from __future__ import annotations

import selectors
import socket
import threading
import urllib.parse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trellis_cli.cluster import Cluster


class Tunnel:
    """A listener on 127.0.0.1; each connection to it is a new port-forward to ``port`` of
    the pod, its bytes relayed both ways until either side closes."""

    def __init__(self, cluster: Cluster, pod: str, port: int, namespace: str = "") -> None:
        self.cluster, self.pod, self.port = cluster, pod, port
        self.namespace = namespace or cluster.target.namespace  # "": the control plane's
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.local_port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name=f"tunnel {pod}:{port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        if self.cluster.lite is not None:
            self._relay_lite(conn)
            return
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import ws_client

        path = f"/api/v1/namespaces/{_q(self.namespace)}/pods/{_q(self.pod)}"
        _, url, headers, _, _ = self.cluster.api.param_serialize(
            "GET", path + "/portforward", query_params=[("ports", str(self.port))],
            auth_settings=["BearerToken"],
        )  # fmt: skip
        try:  # the websocket call of kubernetes.stream.portforward, without the typed API
            forward = ws_client.portforward_call(  # type: ignore[no-untyped-call]
                self.cluster.api.configuration, "GET", url, headers=headers
            )
        except (ApiException, OSError):
            conn.close()  # the client sees the connection end: unreachable
            return
        remote = forward.socket(self.port)
        try:
            _pump(conn, remote)
        finally:
            conn.close()
            forward.close()

    def _relay_lite(self, conn: socket.socket) -> None:
        from trellis_cli import kubelite

        path = f"/api/v1/namespaces/{_q(self.namespace)}/pods/{_q(self.pod)}"
        try:
            forward = self.cluster.lite.portforward(path + "/portforward", self.port)
        except Exception:  # noqa: BLE001  # websocket-client's handshake errors, OSError
            conn.close()  # the client sees the connection end: unreachable
            return
        try:
            kubelite.relay(forward, conn)
        finally:
            conn.close()

    def close(self) -> None:
        self._listener.close()


def _pump(one: Any, other: Any) -> None:
    """Copy bytes between two sockets until either closes."""
    peers = {one.fileno(): other, other.fileno(): one}
    with selectors.DefaultSelector() as selector:
        selector.register(one.fileno(), selectors.EVENT_READ, one)
        selector.register(other.fileno(), selectors.EVENT_READ, other)
        while True:
            for key, _ in selector.select():
                try:
                    data = key.data.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                try:
                    peers[key.fd].sendall(data)
                except OSError:
                    return


def _closed_port() -> int:
    """A local port nothing listens on: the admin URL of a component with no pod, so that
    a request to it fails as an unreachable one does."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _q(name: str) -> str:
    """A name as one segment of a URL path."""
    return urllib.parse.quote(name, safe="")
