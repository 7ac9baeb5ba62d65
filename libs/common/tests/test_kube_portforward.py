"""The test API server's pod port-forward, through the real client's ``stream.portforward``."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward

from trellis_testing import kubeportforward
from trellis_testing.waiting import wait_until


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[tuple[str, int]]:
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as server:
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        host, port = server.server_address[:2]
        yield str(host), int(port)
        server.shutdown()


def _pod(core: Any, name: str, phase: str = "Running") -> None:
    body = {
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"containers": [{"name": "app", "image": "app"}]},
    }
    core.create_namespaced_pod("shop", body)
    core.patch_namespaced_pod_status(name, "shop", {"status": {"phase": phase}})


def _close(forward: Any) -> None:
    """Close the forward's ports and wait for its thread to close the websocket (else the
    thread outlives the test and its API server)."""
    forward.close()
    wait_until(lambda: not forward.connected, 10, "the forward's websocket closes")


def _receive(sock: Any, size: int) -> bytes:
    received = b""
    while len(received) < size:
        chunk = sock.recv(size - len(received))
        if not chunk:
            break
        received += chunk
    return received


def test_a_port_forward_reaches_the_pods_port_both_ways(kube: Any, echo: tuple[str, int]) -> None:
    api, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    _pod(core, "web-0")
    kubeportforward.forward(api.server, "shop", "web-0", 8443, echo)
    forward = portforward(
        core.connect_get_namespaced_pod_portforward, "web-0", "shop", ports="8443"
    )
    sock = forward.socket(8443)
    sock.settimeout(10)
    try:
        for message in (b"hello", b"x" * 200_000):  # larger than one websocket message
            sock.sendall(message)
            assert _receive(sock, len(message)) == message
        assert forward.error(8443) is None
    finally:
        _close(forward)


def test_two_ports_of_one_pod_each_reach_their_own(kube: Any, echo: tuple[str, int]) -> None:
    api, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    _pod(core, "web-0")
    with socket.create_server(("127.0.0.1", 0)) as other:
        kubeportforward.forward(api.server, "shop", "web-0", 80, echo)
        kubeportforward.forward(api.server, "shop", "web-0", 81, other.getsockname()[:2])
        forward = portforward(
            core.connect_get_namespaced_pod_portforward, "web-0", "shop", ports="80,81"
        )
        try:
            forward.socket(80).settimeout(10)
            forward.socket(80).sendall(b"one")
            assert _receive(forward.socket(80), 3) == b"one"
            accepted, _ = other.accept()
            with accepted:
                accepted.sendall(b"from 81")
                forward.socket(81).settimeout(10)
                assert _receive(forward.socket(81), 7) == b"from 81"
        finally:
            _close(forward)


def test_a_port_nothing_listens_on_fails_on_its_error_channel(kube: Any) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    _pod(core, "web-0")
    forward = portforward(core.connect_get_namespaced_pod_portforward, "web-0", "shop", ports="9")
    sock = forward.socket(9)
    sock.settimeout(10)
    try:
        assert sock.recv(10) == b""  # the client closes the port on an error
        assert "error forwarding port 9 to pod shop/web-0" in (forward.error(9) or "")
    finally:
        _close(forward)


@pytest.mark.parametrize(("pod", "status"), [("missing", 0), ("pending", 0)])
def test_no_port_forward_to_a_missing_or_not_running_pod(kube: Any, pod: str, status: int) -> None:
    _, api_client = kube
    core: Any = client.CoreV1Api(api_client)
    _pod(core, "pending", phase="Pending")
    with pytest.raises(ApiException) as refused:
        portforward(core.connect_get_namespaced_pod_portforward, pod, "shop", ports="80")
    # the client reports a failed upgrade as status 0, with the server's answer in the reason
    assert refused.value.status == status
    expected = "404" if pod == "missing" else "400"
    assert expected in str(refused.value.reason)
