"""The dashboard's scraper against a real Envoy: its stats filter is one Envoy accepts, and
requests through the proxy become an edge with a rate, requests it has no route for a
denied edge. (The whole-mesh test does the same through `trellis up`'s demo sidecars.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from trellis_cli import dashboard
from trellis_cli.client import Mesh
from trellis_cli.meshedges import DENIED
from trellis_testing.envoy import Envoy
from trellis_testing.ports import free_port

pytestmark = pytest.mark.slow

CLUSTER = "shop/web|8080"


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        return


def bootstrap(listen: int, app: int) -> dict[str, Any]:
    """A sidecar of shop/client: one outbound listener whose only route is to shop/web."""
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
                    {"match": {"prefix": "/"}, "route": {"cluster": CLUSTER}}
                ]}
            ]
        },
        "http_filters": [router],
    }  # fmt: skip
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": app}}}
    return {
        "node": {"id": "client-1", "cluster": "shop/client"},
        "static_resources": {
            "listeners": [
                {
                    "name": "outbound",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": manager,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": CLUSTER,
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "load_assignment": {
                        "cluster_name": CLUSTER,
                        "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
                    },
                }
            ],
        },
    }


@pytest.fixture
def app() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_traffic_through_a_real_envoy_is_an_edge_with_a_rate(tmp_path: Path, app: int) -> None:
    listen = free_port()
    envoy = Envoy(bootstrap(listen, app), tmp_path / "envoy").start()
    try:
        envoy.wait_ready()
        scraper = dashboard.Scraper(Mesh(tmp_path / "state"), (envoy.admin,))
        scraper.scrape_once()
        with httpx.Client(base_url=f"http://127.0.0.1:{listen}", timeout=5) as client:
            for _ in range(10):
                assert client.get("/", headers={"host": "web"}).status_code == 200
            for _ in range(4):
                assert client.get("/", headers={"host": "elsewhere"}).status_code == 404
        picture = scraper.scrape_once()
    finally:
        envoy.stop()
    assert [e for e in picture["errors"] if not e.startswith("catalog:")] == []
    edges = {(e["source"], e["destination"]): e for e in picture["edges"]}
    web = edges[("shop/client", "shop/web")]
    assert web["requests"] == 10
    assert web["rps"] > 0
    assert web["success_rate"] == 1.0
    assert web["tls"] == "plaintext"  # a static cluster with no transport socket
    denied = edges[("shop/client", DENIED)]
    assert denied["requests"] == 4
    assert denied["denied_rps"] > 0
    assert denied["success_rate"] == 0.0
