"""The pod agent sends its token only to proxy-cp: a server that the mesh CA signed for
proxy-cp's DNS name, but that is another identity, is refused before anything is sent."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from trellis_cli.agent import AgentConfig, AgentError, check_server, enroll
from trellis_common import components
from trellis_common.bootstrap import BootstrapSpec, ProxyFiles, envoy_bootstrap
from trellis_identity.identity import Material
from trellis_testing.identities import LocalCA

PROXY_CP_NAME = "proxy-cp.trellis-system.svc"


@contextmanager
def tls_server(material: Material, folder: Path) -> Iterator[str]:
    """A TLS server presenting ``material`` (handshakes only); yields ``host:port``."""
    cert, key = folder / "server.pem", folder / "server-key.pem"
    cert.write_bytes(material.cert_chain_pem)
    key.write_bytes(material.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            try:
                with context.wrap_socket(raw, server_side=True) as wrapped:
                    wrapped.recv(1)
            except (OSError, ssl.SSLError):
                pass  # the client refused the handshake: what the test wants
            finally:
                raw.close()  # also when the handshake failed before the wrapper owned it

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def config(ca: LocalCA, address: str, tmp_path: Path) -> AgentConfig:
    token = tmp_path / "token"
    token.write_text("a-pod-token")
    folder = Path("/etc/trellis/proxy")
    bootstrap = envoy_bootstrap(
        BootstrapSpec(
            node_id="pending",
            namespace="shop",
            service="cart",
            files=ProxyFiles(folder / "cert.pem", folder / "key.pem", folder / "ca.pem"),
            proxy_cp_spiffe_id=components.spiffe_id("cluster.local", "proxy-cp").uri,
        )
    )
    return AgentConfig(
        address=address,
        server_name=PROXY_CP_NAME,
        ca_pem=ca.bundle_pem,
        service="cart",
        token_path=token,
        folder=tmp_path / "proxy",
        bootstrap=yaml.safe_dump(bootstrap),
    )


def test_proxy_cp_itself_is_accepted(tmp_path: Path) -> None:
    ca = LocalCA()
    with tls_server(ca.identity("proxy-cp").material, tmp_path) as address:
        check_server(config(ca, address, tmp_path))


def test_a_server_with_proxy_cps_name_but_another_identity_gets_no_token(
    tmp_path: Path,
) -> None:
    ca = LocalCA()
    names = [x509.DNSName(n) for n in components.dns_names("proxy-cp", "cluster.local")]
    impostor = ca.issue(
        "proxy-cp.trellis-system",
        [*names, x509.UniformResourceIdentifier("spiffe://cluster.local/ns/shop/sa/cart")],
    )
    assert PROXY_CP_NAME in [n.value for n in names]  # gRPC's name check would pass it
    wrong = "is not proxy-cp \\(wrong_identity\\)"
    with (
        tls_server(impostor, tmp_path) as address,
        pytest.raises(AgentError, match=wrong) as refused,
    ):
        enroll(config(ca, address, tmp_path))
    assert "no token was sent" in str(refused.value)
    assert "a-pod-token" not in str(refused.value)


def test_a_bootstrap_without_proxy_cps_identity_is_refused(tmp_path: Path) -> None:
    ca = LocalCA()
    broken = replace(config(ca, "127.0.0.1:1", tmp_path), bootstrap="node: {id: x}\n")
    with pytest.raises(AgentError, match="names no proxy-cp identity"):
        check_server(broken)
