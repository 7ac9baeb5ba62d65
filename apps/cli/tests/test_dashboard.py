"""``trellis dashboard``: the page's JSON from the catalog's answers, the local server, and
what it says when the mesh is not there."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from trellis_cli import dashboard
from trellis_cli.client import Mesh
from trellis_cli.main import cli
from trellis_cli.meshedges import DENIED, Edge, Sample, SidecarStats
from trellis_testing.waiting import wait_until

BUYER = "spiffe://cluster.local/ns/bookbuyer/sa/bookbuyer"


def view_of_v1() -> dict[str, Any]:
    return {
        "identity": "bookstore/bookstore-v1",
        "inbound": [
            {
                "port": 14001,
                "rules": [
                    {
                        "policy": "bookstore/bookbuyer-access-bookstore",
                        "source_spiffe_ids": [BUYER],
                        "http": [{"path_regex": "/books-bought", "methods": ["GET"]}],
                    }
                ],
            }
        ],
    }


def view_of_buyer() -> dict[str, Any]:
    split = {
        "name": "split",
        "match": {"path_regex": ".*"},
        "clusters": [
            {"cluster": "bookstore/bookstore-v1|14001", "weight": 80},
            {"cluster": "bookstore/bookstore-v2|14001", "weight": 20},
        ],
    }
    return {
        "identity": "bookbuyer/bookbuyer",
        "outbound": [{"namespace": "bookstore", "name": "bookstore", "routes": [split]}],
    }


def policy() -> dict[str, Any]:
    rejected = {
        "key": "HTTPRoute bookstore/broken",
        "namespace": "bookstore",
        "name": "broken",
        "state": "error",
        "reason": "backendRef bookstore/nowhere does not exist",
        "parents": [{"kind": "Service", "namespace": "bookstore", "name": "bookstore-v1"}],
    }
    stray = {"key": "TrafficSplit elsewhere/x", "namespace": "elsewhere", "name": "x"}
    return {
        "services": [
            {"namespace": "bookstore", "name": name, "endpoints": 1}
            for name in ("bookstore", "bookstore-v1", "bookstore-v2")
        ],
        "views": {"bookstore/bookstore-v1": view_of_v1(), "bookbuyer/bookbuyer": view_of_buyer()},
        "rejected": [rejected, stray],
    }


def test_each_service_shows_who_may_reach_it_its_routes_and_rejected_documents() -> None:
    edges = [
        Edge("bookbuyer/bookbuyer", "bookstore/bookstore-v1", requests=5, rps=2.0),
        Edge("bookthief/bookthief", DENIED, requests=3, rps=1.0, denied_rps=1.0),
    ]
    samples = [Sample("http://x", "bookbuyer/bookbuyer", SidecarStats(clusters={}), {})]
    picture = dashboard.assemble(policy(), edges, samples)
    services = {s["id"]: s for s in picture["services"]}
    assert set(services) == {
        "bookbuyer/bookbuyer", "bookthief/bookthief", DENIED,
        "bookstore/bookstore", "bookstore/bookstore-v1", "bookstore/bookstore-v2",
    }  # fmt: skip
    v1 = services["bookstore/bookstore-v1"]
    assert v1["may_reach_it"] == [
        {
            "policy": "bookstore/bookbuyer-access-bookstore",
            "from": ["bookbuyer/bookbuyer"],
            "requests": ["GET /books-bought"],
            "port": 14001,
        }
    ]
    assert [d["key"] for d in v1["rejected"]] == ["HTTPRoute bookstore/broken"]
    apex = services["bookstore/bookstore"]
    assert apex["routes"] == [
        {
            "name": "split",
            "match": "* .*",
            "backends": [
                {"service": "bookstore/bookstore-v1", "weight": 80},
                {"service": "bookstore/bookstore-v2", "weight": 20},
            ],
        }
    ]
    assert services["bookbuyer/bookbuyer"]["sidecars"] == 1
    assert services[DENIED]["kind"] == "denied"
    assert [d["key"] for d in picture["rejected"]] == ["TrafficSplit elsewhere/x"]
    assert picture["edges"][1]["denied_rps"] == 1.0


def test_sidecars_are_found_by_their_bootstrap_files(tmp_path: Path) -> None:
    for name, port in (("bookbuyer", 15130), ("bookthief", 15140)):
        folder = tmp_path / "demo" / name
        folder.mkdir(parents=True)
        (folder / "envoy.yaml").write_text(
            f"admin:\n  address:\n    socket_address: {{address: 127.0.0.1, port_value: {port}}}\n"
        )
    (tmp_path / "demo" / "half-written").mkdir()
    (tmp_path / "demo" / "half-written" / "envoy.yaml").write_text("admin: [")
    assert dashboard.sidecars_of(tmp_path) == ["http://127.0.0.1:15130", "http://127.0.0.1:15140"]


def test_without_a_mesh_the_picture_says_what_it_could_not_read(tmp_path: Path) -> None:
    scraper = dashboard.Scraper(Mesh(tmp_path), ("http://127.0.0.1:9",))  # discard: refused
    picture = scraper.scrape_once()
    assert picture["edges"] == []
    assert picture["services"] == []
    catalog, sidecar = picture["errors"]
    assert catalog.startswith("catalog: ")
    assert "trust bundle" in catalog
    assert sidecar.startswith("sidecar http://127.0.0.1:9: ConnectError")


def test_the_scraper_sleeps_while_no_page_polls_and_wakes_on_the_next_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard, "IDLE_AFTER", 0.3)
    scraper = dashboard.Scraper(Mesh(tmp_path), ("http://127.0.0.1:9",))
    stop = threading.Event()
    thread = threading.Thread(target=scraper.run, args=(stop, 0.02), daemon=True)
    thread.start()
    try:
        # unwatched since its start: it scrapes a few times, then sleeps
        wait_until(lambda: scraper.sleeping, 10, "the scraper sleeps")
        assert scraper.scrapes >= 2
        asleep, rates = scraper.scrapes, scraper.rates
        assert not scraper.watched.wait(0.5)  # nothing woke it...
        assert scraper.scrapes == asleep  # ...and it read nothing meanwhile
        scraper.snapshot()  # a page polls
        wait_until(lambda: scraper.scrapes > asleep, 10, "the scraper wakes")
        assert not scraper.sleeping
        assert scraper.rates is not rates  # rates start afresh after a pause
    finally:
        stop.set()
        thread.join(5)
    assert not thread.is_alive()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    scraper = dashboard.Scraper(Mesh(tmp_path))
    scraper.latest = dashboard.assemble(policy(), [], [])
    server = dashboard._Server(0, scraper)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield dashboard.url_of(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_the_server_serves_the_page_and_its_json_and_nothing_else(served: str) -> None:
    page = httpx.get(served)
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert 'fetch("/api/mesh"' in page.text
    assert "<script src" not in page.text
    body = httpx.get(served + "api/mesh")
    assert body.headers["cache-control"] == "no-store"
    assert {s["id"] for s in json.loads(body.text)["services"]} >= {"bookstore/bookstore-v1"}
    assert httpx.get(served + "config_dump").status_code == 404
    assert httpx.post(served + "api/mesh").status_code == 501  # read-only


def test_another_host_name_is_refused_counted_and_logged(
    served: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """DNS rebinding: a page under any other name that resolves to 127.0.0.1 gets nothing."""
    port = served.rstrip("/").rsplit(":", 1)[1]
    rebound = httpx.get(served + "api/mesh", headers={"host": f"attacker.example:{port}"})
    assert rebound.status_code == 403
    assert "services" not in rebound.text
    assert httpx.get(f"http://localhost:{port}/api/mesh").status_code == 200
    assert httpx.get(served + "api/mesh").json()["refused_requests"] == 1
    assert "dashboard.refused host='attacker.example:" in capsys.readouterr().err


def test_a_sidecar_that_is_not_a_url_is_refused(tmp_path: Path) -> None:
    done = CliRunner().invoke(
        cli, ["--state-dir", str(tmp_path), "dashboard", "--no-open", "--sidecar", "15000"]
    )
    assert done.exit_code == 2
    assert "'15000' is not an http:// URL" in done.output
