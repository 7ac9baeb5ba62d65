"""MeshConfig ``observability.tracing`` as Envoy's Zipkin tracing, with real sidecars and a
collector that speaks the Zipkin v2 API (``POST /api/v2/spans``, a JSON list of spans).

The bookstore mesh traces once the MeshConfig turns tracing on: bookbuyer's sidecar reports
its outbound spans and bookstore's sidecars their inbound ones, each span tagged with the
proxy's service and the direction, and both sides of a request share its trace id.
"""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from trellis_testing import eventually
from trellis_testing.mesh import BOOKSTORE, Mesh, bookstore

pytestmark = pytest.mark.integration


class _Collect(BaseHTTPRequestHandler):
    server: Collector
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self._body()
        if self.path == "/api/v2/spans":
            self.server.spans.extend(json.loads(body))
        self.send_response(202)
        self.send_header("content-length", "0")
        self.end_headers()

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() != "chunked":
            return self.rfile.read(int(self.headers.get("content-length", 0)))
        body = b""
        while True:  # HTTP/1.1 chunked: <hex size>\r\n<data>\r\n ... 0\r\n\r\n
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                self.rfile.readline()
                return body
            body += self.rfile.read(size)
            self.rfile.readline()

    def log_message(self, format: str, *args: Any) -> None:
        return


class Collector(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Collect)
        self.spans: list[dict[str, Any]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def test_sidecars_report_tagged_spans_to_the_meshconfigs_collector(mesh: Mesh) -> None:
    collector = Collector()
    try:
        v1, v2, buyer = bookstore(mesh)
        config = mesh.spec_dir / "meshconfig.yaml"
        config.write_text(
            config.read_text()
            + "  observability:\n    tracing:\n      enable: true\n      address: 127.0.0.1\n"
            + f"      port: {collector.port}\n      endpoint: /api/v2/spans\n"
        )

        def traced() -> bool:  # on both sides: the destinations' inbound listeners too
            return all(
                "envoy.tracers.zipkin"
                in sidecar.envoy.get("/config_dump?resource=dynamic_listeners").text
                for sidecar in (buyer, v1, v2)
            )

        asyncio.run(eventually(traced, timeout=15, interval=0.2, message="tracing reaches Envoy"))

        def reported() -> set[tuple[str, str]]:
            return {
                (s.get("tags", {}).get("service", ""), s.get("tags", {}).get("direction", ""))
                for s in collector.spans
            }

        wanted = {("bookbuyer/bookbuyer", "outbound")}

        def both_sides() -> bool:
            # A request keeps going out while we wait: bookbuyer's sidecar may still hold a
            # pooled connection to a destination's replaced (draining, untraced) inbound
            # listener, and only requests on the new listener are traced there.
            assert buyer.get(BOOKSTORE, "/books-bought").status_code == 200
            return wanted <= reported() and any(d == "inbound" for _, d in reported())

        asyncio.run(
            eventually(
                both_sides,
                timeout=30,
                interval=0.3,
                message="spans of both sides reach the collector",
            )
        )
        inbound = [s for s in collector.spans if s.get("tags", {}).get("direction") == "inbound"]
        assert {s["tags"]["service"] for s in inbound} <= {
            "bookstore/bookstore-v1",
            "bookstore/bookstore-v2",
        }
        outbound_traces = {
            s["traceId"] for s in collector.spans if s["tags"].get("direction") == "outbound"
        }
        assert outbound_traces & {s["traceId"] for s in inbound}  # one trace, both sides
    finally:
        collector.shutdown()
        collector.server_close()
