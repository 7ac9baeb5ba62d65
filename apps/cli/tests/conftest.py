"""A real sidecar for the dashboard's sources (test_dashprom, test_dashpods): one Envoy of
``shop/client`` with two outbound clusters, ``shop/web|8080`` in plaintext to a local app,
and ``shop/db|5432`` with mTLS (the client presents a certificate of a throwaway CA), and
a caller that sends requests it has a route for and requests it has none for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from trellis_testing.envoy import Envoy
from trellis_testing.identities import LocalCA
from trellis_testing.ports import free_port

WEB = "shop/web|8080"
DB = "shop/db|5432"


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        return


def _cluster(name: str, port: int, tls: dict[str, Any] | None = None) -> dict[str, Any]:
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
        },
        **({"transport_socket": tls} if tls else {}),
    }


def _mtls() -> dict[str, Any]:
    ca = LocalCA()
    spiffe = x509.UniformResourceIdentifier("spiffe://cluster.local/ns/shop/sa/client")
    material = ca.issue("client.shop", [spiffe])
    certificate = {
        "certificate_chain": {"inline_string": material.cert_chain_pem.decode()},
        "private_key": {"inline_string": material.key_pem.decode()},
    }
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/"
            "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [certificate],
                "validation_context": {"trusted_ca": {"inline_string": ca.bundle_pem.decode()}},
            },
        },
    }


def bootstrap(listen: int, app: int) -> dict[str, Any]:
    router = {
        "name": "envoy.filters.http.router",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
        },
    }
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
        ".v3.HttpConnectionManager",
        "stat_prefix": "outbound",
        "route_config": {
            "virtual_hosts": [
                {"name": "web", "domains": ["web"], "routes": [
                    {"match": {"prefix": "/"}, "route": {"cluster": WEB}}
                ]}
            ]
        },
        "http_filters": [router],
    }  # fmt: skip
    listener = {
        "name": "outbound",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
        "filter_chains": [
            {
                "filters": [
                    {"name": "envoy.filters.network.http_connection_manager",
                     "typed_config": manager}
                ]
            }
        ],
    }  # fmt: skip
    return {
        "node": {"id": "client-1", "cluster": "shop/client"},
        "static_resources": {
            "listeners": [listener],
            "clusters": [_cluster(WEB, app), _cluster(DB, free_port(), _mtls())],
        },
    }


@dataclass(frozen=True)
class Sidecar:
    """The sidecar's Envoy; its outbound clusters are :data:`WEB` and :data:`DB`."""

    envoy: Envoy
    listen: int

    def send(self, routed: int, unrouted: int) -> None:
        """``routed`` requests to shop/web (200), ``unrouted`` it has no route for (404)."""
        with httpx.Client(base_url=f"http://127.0.0.1:{self.listen}", timeout=5) as client:
            for _ in range(routed):
                assert client.get("/", headers={"host": "web"}).status_code == 200
            for _ in range(unrouted):
                assert client.get("/", headers={"host": "elsewhere"}).status_code == 404


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    app = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=app.serve_forever, daemon=True).start()
    listen = free_port()
    envoy = Envoy(bootstrap(listen, app.server_address[1]), tmp_path / "envoy").start()
    try:
        envoy.wait_ready()
        yield Sidecar(envoy, listen)
    finally:
        envoy.stop()
        app.shutdown()
        app.server_close()
