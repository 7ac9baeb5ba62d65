"""A Gateway's Envoy as real Envoy sees it: ``envoy --mode validate`` on HTTP and HTTPS
gateways, and one Envoy serving HTTP, gRPC over h2c and HTTPS by server name."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import grpc
import httpx
import pytest

from trellis_proxy_cp.testing.gateway import HELLO, WEB, gateway_view, write_certificate
from trellis_proxy_cp.testing.static import cluster, static_bootstrap
from trellis_proxy_cp.translate.proxy import Resources, translate
from trellis_proxy_cp.translate.secrets import SecretMaterial
from trellis_proxy_cp.translate.settings import ProxySettings
from trellis_testing import envoy
from trellis_testing.apps import AppServer
from trellis_testing.grpcapp import GrpcApp, call
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually


@pytest.fixture
def gateway_settings(
    sidecar: Callable[..., ProxySettings], tmp_path: Path
) -> Callable[[], ProxySettings]:
    """A gateway's settings whose workload and listener certificates are real files."""
    certs = tmp_path / "gateway-certs"
    write_certificate(certs / "edge" / "foo-cert", "foo.example.com")
    write_certificate(certs / "edge" / "bar-cert", "bar.example.com")
    return lambda: sidecar(gateway=True, gateway_certs_dir=str(certs))


def validated(resources: Resources) -> None:
    result = envoy.validate(static_bootstrap(resources))
    assert result.returncode == 0, result.stdout + result.stderr


def test_envoy_accepts_an_http_and_https_gateway(
    gateway_settings: Callable[[], ProxySettings], real_material: SecretMaterial
) -> None:
    validated(translate(gateway_view(), gateway_settings(), real_material))


def test_envoy_accepts_a_gateway_with_only_an_https_port_and_a_default_chain(
    gateway_settings: Callable[[], ProxySettings], real_material: SecretMaterial
) -> None:
    view = gateway_view()
    del view.gateway_ports[0]
    view.gateway_ports[0].servers[1].hostname = ""
    view.gateway_ports[0].servers[1].virtual_hosts[0].domains[:] = ["*"]
    validated(translate(view, gateway_settings(), real_material))


def https_get(port: int, host: str, cafile: Path, path: str) -> bytes:
    """One HTTP/1.1 request over TLS for ``host`` (SNI and Host), verified against
    ``cafile``: the raw answer."""
    context = ssl.create_default_context(cafile=str(cafile))
    context.set_alpn_protocols(["http/1.1"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as connection,
    ):
        connection.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        )
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_a_real_envoy_serves_http_grpc_over_h2c_and_https_by_server_name(
    gateway_settings: Callable[[], ProxySettings], real_material: SecretMaterial, tmp_path: Path
) -> None:
    """The translation alone (no mesh: plaintext backends), one real Envoy: HTTP by Host,
    a grpcio client over h2c on the same port, HTTPS with each name's own certificate
    (HTTP/1.1, and gRPC over h2 by ALPN)."""
    web, hello = AppServer("web").start(), GrpcApp("hello").start()
    http_port, https_port = free_port(), free_port()
    backends = [
        cluster(WEB, ("127.0.0.1", web.port), mesh_tls=False),
        cluster(HELLO, ("127.0.0.1", hello.port), protocol="grpc", mesh_tls=False),
    ]
    settings = gateway_settings()
    resources = translate(gateway_view(http_port, https_port, backends), settings, real_material)
    proxy = envoy.Envoy(static_bootstrap(resources), tmp_path / "envoy", "gateway")
    certs = Path(settings.gateway_certs_dir) / "edge"
    base = f"http://127.0.0.1:{http_port}"
    try:
        proxy.start().wait_ready()

        def get(path: str, host: str) -> httpx.Response:
            return httpx.get(base + path, headers={"host": host}, timeout=5)

        asyncio.run(
            eventually(lambda: get("/x", "any").status_code == 200, message="the HTTP port")
        )
        assert get("/x", "any").json()["app"] == "web"
        named = get("/foo/x", f"foo.example.com:{http_port}")  # the port is stripped
        assert (named.status_code, named.json()["path"]) == (200, "/foo/x")
        assert get("/x", "foo.example.com").status_code == 404  # foo's host routes /foo only
        with grpc.insecure_channel(f"127.0.0.1:{http_port}") as channel:
            assert call(channel, "/helloworld.Greeter/SayHello")["app"] == "hello"

        foo = https_get(https_port, "foo.example.com", certs / "foo-cert" / "tls.crt", "/x")
        assert foo.startswith(b"HTTP/1.1 200")
        assert b'"app": "web"' in foo
        bar = https_get(https_port, "bar.example.com", certs / "bar-cert" / "tls.crt", "/x")
        assert bar.startswith(b"HTTP/1.1 200")
        with pytest.raises(ssl.SSLError):  # bar's chain presents bar's certificate, not foo's
            https_get(https_port, "bar.example.com", certs / "foo-cert" / "tls.crt", "/x")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=(certs / "bar-cert" / "tls.crt").read_bytes()
        )
        options = [("grpc.ssl_target_name_override", "bar.example.com")]
        with grpc.secure_channel(f"127.0.0.1:{https_port}", credentials, options) as channel:
            assert call(channel, "/helloworld.Greeter/SayHello")["app"] == "hello"
        assert hello.calls == 2
    finally:
        proxy.stop()
        web.stop()
        hello.stop()
