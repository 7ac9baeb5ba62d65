"""``bench/envoy_admin.py``: reading what an Envoy serves from its admin API's answers."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tests.bench.loader import bench_module

envoy_admin = bench_module("envoy_admin")


def _assignment(cluster: str, *addresses: str) -> dict[str, Any]:
    """One entry of ``/config_dump?resource=dynamic_endpoint_configs&include_eds`` (Envoy
    1.40 leaves ``endpoints`` out of a cluster that has none)."""
    endpoints = [
        {
            "endpoint": {"address": {"socket_address": {"address": a, "port_value": 14001}}},
            "health_status": "HEALTHY",
        }
        for a in addresses
    ]
    assignment: dict[str, Any] = {"cluster_name": cluster, "policy": {}}
    if endpoints:
        assignment["endpoints"] = [{"locality": {}, "lb_endpoints": endpoints}]
    return {"endpoint_config": assignment}


def test_eds_addresses_are_every_endpoint_of_the_dumped_assignments() -> None:
    dump = {
        "configs": [
            _assignment("bookstore/bookstore-v1|14001", "127.0.0.1", "201.0.0.7"),
            _assignment("bookstore/bookstore-v2|14001"),
        ]
    }
    assert envoy_admin.eds_addresses(json.dumps(dump).encode()) == {"127.0.0.1", "201.0.0.7"}
    assert envoy_admin.eds_addresses(b"{}") == set()  # no cluster of that name (yet)


def test_the_eds_path_asks_for_one_service_and_no_other_whose_name_starts_the_same() -> None:
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(envoy_admin.eds_path("ns/svc|")).query)
    [regex] = query["name_regex"]
    assert query["resource"] == ["dynamic_endpoint_configs"]
    assert re.match(regex, "ns/svc|14001")
    assert not re.match(regex, "ns/svc-2|14001")  # "|" is a literal, not an alternative


def test_split_weights_are_read_from_every_weighted_route() -> None:
    v1, v2 = "bookstore/bookstore-v1|14001", "bookstore/bookstore-v2|14001"
    split = {"weighted_clusters": {"clusters": [{"name": v1, "weight": 79}, {"name": v2}]}}
    hosts = [
        {"name": "bookstore/bookstore|14001", "routes": [{"match": {}, "route": split}]},
        {"name": v1, "routes": [{"match": {}, "route": {"cluster": v1}}]},  # not weighted
    ]
    dump = {"configs": [{"route_config": {"name": "outbound-http", "virtual_hosts": hosts}}]}
    # a weight of 0 is left out of the JSON, as protobuf leaves default values out
    assert envoy_admin.split_weights(json.dumps(dump).encode()) == {v1: 79, v2: 0}


def test_a_logger_level_is_read_from_the_listing() -> None:
    listing = b"active loggers:\n  a2a: info\n  admin: info\n  lua: error\n"
    assert envoy_admin.logger_level(listing, "lua") == "error"
    assert envoy_admin.logger_level(listing, "kafka") is None


class _Admin(http.server.BaseHTTPRequestHandler):
    """An admin API whose ``/state`` says "old" to the first three polls, then "new"."""

    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's
    polls = 0

    def do_GET(self) -> None:
        if self.path != "/state":
            self._answer(404, b"no such page")
            return
        type(self).polls += 1
        self._answer(200, b"new" if type(self).polls > 3 else b"old")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def admin_url() -> Iterator[str]:
    _Admin.polls = 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_poller_reports_the_first_answer_that_shows_the_change(admin_url: str) -> None:
    poller = envoy_admin.Poller(admin_url)
    try:
        since = time.perf_counter()
        lag = poller.until("/state", lambda body: body == b"new", since)
        assert _Admin.polls == 4  # three answers without the change, then the first with it
        assert 0 < lag <= time.perf_counter() - since
        with pytest.raises(RuntimeError, match="answered 404"):
            poller.fetch("/elsewhere")
    finally:
        poller.close()
