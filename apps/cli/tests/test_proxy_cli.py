"""``trellis proxy list`` and ``trellis proxy config`` against proxy-cp's real admin routes.

proxy-cp's admin app (its real REST routes over a real control plane, snapshot cache and
stream registry) is served by uvicorn on 127.0.0.1 in a background thread with its own event
loop; the state directory points the CLI at it, as ``trellis up`` would.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from rich.console import Console

from trellis_cli import output
from trellis_cli.main import cli
from trellis_cli.testing import Answer, CannedAdmin
from trellis_common import statefile, version
from trellis_proxy_cp import testing as t
from trellis_proxy_cp.cache.store import SnapshotCache
from trellis_proxy_cp.transport import rest
from trellis_proxy_cp.transport.streams import StreamRegistry
from trellis_proxy_cp.types import CLUSTER, LISTENER, ROUTE
from trellis_runtime import admin

STORE = t.proxy_common_name("bookstore", "bookstore", 1)
BUYER = t.proxy_common_name("bookbuyer", "bookbuyer", 2)
REVIEWS = t.proxy_common_name("reviews", "bookstore", 3)
NACK = "duplicate domain reviews"


async def populate() -> FastAPI:
    """proxy-cp's admin app with three proxies: one up to date, one with a NACK and a refused
    snapshot, one still waiting."""
    cache = SnapshotCache()
    control_plane = t.FakeSources().control_plane(cache)
    streams = StreamRegistry()
    store = await t.connect(control_plane, streams, STORE)
    current = cache.get(store.key)
    assert current is not None
    t.acknowledge(store, current)
    buyer = await t.connect(
        control_plane, streams, BUYER, protocol="delta", envoy_version=(1, 39, 2)
    )
    t.reject(buyer, ROUTE, "v2", NACK)
    await control_plane.set_view("bookbuyer/bookbuyer", t.broken_view("bookbuyer/bookbuyer", "2"))
    reviews = await t.connect(control_plane, streams, REVIEWS)
    reviews.state(CLUSTER).sent_version = "v1"
    reviews.state(LISTENER)  # asked for, nothing sent yet
    app = admin.create_app("proxy-cp", CollectorRegistry())
    rest.add_routes(app, streams, cache, control_plane)
    return app


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory whose proxy-cp endpoint is served from a background thread."""
    directory = tmp_path_factory.mktemp("state")
    started = threading.Event()
    ports: list[int] = []
    errors: list[BaseException] = []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        app = await populate()
        server = admin.AdminServer(app, "127.0.0.1", 0, on_started=ports.append)
        task = asyncio.create_task(server.run(stop))
        await server.started.wait()
        started.set()
        await task

    def run() -> None:
        try:
            loop.run_until_complete(serve())
        except BaseException as error:
            errors.append(error)
        finally:
            started.set()
            loop.close()

    thread = threading.Thread(target=run, name="proxy-cp-admin", daemon=True)
    thread.start()
    assert started.wait(10), "the admin server did not start"
    assert not errors, errors
    statefile.write_endpoint(
        directory,
        statefile.ServiceEndpoint(
            name="proxy-cp",
            admin_url=f"http://127.0.0.1:{ports[0]}",
            grpc_address="127.0.0.1:0",
            pid=os.getpid(),
        ),
    )
    yield directory
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)
    assert not thread.is_alive()
    assert not errors, errors


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as piped output renders them, whatever terminal the tests run in."""
    monkeypatch.setattr(output, "console", Console(width=240))


def trellis(state_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--state-dir", str(state_dir), *args])


def row_of(text: str, proxy: str) -> str:
    [line] = [line for line in text.splitlines() if proxy in line]
    return line


# -- proxy list ----------------------------------------------------------------------------


def test_list_shows_each_proxy_with_its_state_per_type(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "list")

    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[2]
    for column in ["PROXY", "IDENTITY", "PROTOCOL", "ENVOY", "CONFIG", "LAST ERROR"]:
        assert column in header
    assert "Proxies connected to proxy-cp (3)" in result.stdout
    store = row_of(result.stdout, STORE)
    assert "bookstore/bookstore" in store
    assert "sotw" in store
    assert "1.40.0" in store
    assert "cds ✓ eds ✓ lds ✓ rds ✓ sds ✓" in store
    assert store.rstrip(" │").endswith("-")  # no error
    reviews = row_of(result.stdout, REVIEWS)
    assert "cds sent lds -" in reviews


def test_list_shows_nacks_and_refused_snapshots(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "list")

    buyer = row_of(result.stdout, BUYER)
    assert "delta" in buyer
    assert "1.39.2" in buyer
    assert "rds NACK(1)" in buyer
    assert f"rds: {NACK}" in buyer
    assert "snapshot refused: duplicate" in buyer


def test_list_json_is_proxy_cps_answer(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "list", "--json")

    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert sorted(body) == ["groups", "proxies"]
    proxies = {p["proxy"]: p for p in body["proxies"]}
    assert sorted(proxies) == sorted([STORE, BUYER, REVIEWS])
    assert proxies[BUYER]["types"]["rds"] == {
        "sent_version": "v2",
        "acked_version": None,
        "nacks": 1,
        "last_error": NACK,
    }
    assert (
        proxies[STORE]["types"]["cds"]["acked_version"]
        == (proxies[STORE]["types"]["cds"]["sent_version"])
    )


# -- proxy config --------------------------------------------------------------------------


def test_config_prints_the_resources_as_yaml_without_keys(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "config", STORE)

    assert result.exit_code == 0, result.output
    # the version: the policy's, its slices' and the certificate serial's
    first = result.stdout.splitlines()[0]
    assert re.fullmatch(
        rf"# proxy {re.escape(STORE)}, snapshot version [0-9a-f]+/[0-9a-f]+/s1", first
    )
    resources = yaml.safe_load(result.stdout)
    assert list(resources) == ["cds", "eds", "lds", "rds", "sds"]
    assert {r["name"] for r in resources["lds"]} == {"outbound", "inbound"}
    certificate = next(r for r in resources["sds"] if r["name"] == "service-cert")
    assert certificate["tls_certificate"]["private_key"] == "[redacted]"
    assert base64.b64encode(t.KEY_PEM).decode() not in result.stdout
    assert t.KEY_PEM.splitlines()[1].decode() not in result.stdout


def test_config_filters_by_type(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "config", STORE, "--type", "sds", "--type", "eds")

    assert result.exit_code == 0, result.output
    assert list(yaml.safe_load(result.stdout)) == ["sds", "eds"]


def test_config_json_is_proxy_cps_answer(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "config", STORE, "--type", "cds", "--json")

    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["proxy"] == STORE
    assert re.fullmatch(r"[0-9a-f]+/[0-9a-f]+/s1", body["version"])
    assert sorted(r["name"] for r in body["resources"]["cds"]) == [
        "bookstore/reviews|9080",
        "inbound|14001",
    ]


def test_config_of_an_unknown_proxy_is_a_negative_answer(state_dir: Path) -> None:
    stranger = t.proxy_common_name("bookstore", "bookstore", 42)

    result = trellis(state_dir, "proxy", "config", stranger)

    assert result.exit_code == 1
    assert f"proxy-cp answered 404: proxy '{stranger}' is not connected" in result.stderr
    assert result.stdout == ""


def test_config_refuses_an_unknown_type_before_asking(state_dir: Path) -> None:
    result = trellis(state_dir, "proxy", "config", STORE, "--type", "xds")

    assert result.exit_code == 2
    assert "'xds' is not one of" in result.stderr


def test_an_unreachable_proxy_cp_is_named(tmp_path: Path) -> None:
    statefile.write_endpoint(
        tmp_path,
        statefile.ServiceEndpoint("proxy-cp", "http://127.0.0.1:9", "127.0.0.1:0", os.getpid()),
    )

    result = trellis(tmp_path, "proxy", "list")

    assert result.exit_code == 2  # no answer: not "no proxies"
    assert "proxy-cp is not reachable at http://127.0.0.1:9/v1/proxies" in result.stderr


def _proxy(name: str) -> dict[str, object]:
    return {"proxy": name, "identity": "bookstore/bookstore", "protocol": "sotw",
            "envoy_version": "1.40.0", "types": {}}  # fmt: skip


def test_list_joins_every_replica_and_config_asks_the_one_serving_the_proxy(
    tmp_path: Path,
) -> None:
    config = f"/v1/proxies/{BUYER}/config"
    with (
        CannedAdmin({("GET", "/v1/proxies"): Answer(200, {"proxies": [_proxy(STORE)]})}) as first,
        CannedAdmin(
            {
                ("GET", "/v1/proxies"): Answer(200, {"proxies": [_proxy(BUYER)], "groups": []}),
                ("GET", config): Answer(200, {"proxy": BUYER, "version": "7", "resources": {}}),
            }
        ) as second,
    ):
        first.serve(tmp_path, "proxy-cp")
        second.serve(tmp_path, "proxy-cp-2")  # as `trellis up --proxy-cp-replicas 2` runs it
        listed = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "proxy", "list", "--json"])
        shown = CliRunner().invoke(
            cli, ["--state-dir", str(tmp_path), "proxy", "config", BUYER, "--json"]
        )
    assert listed.exit_code == 0, listed.output
    assert [p["proxy"] for p in json.loads(listed.stdout)["proxies"]] == [STORE, BUYER]
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["version"] == "7"  # proxy-cp answered 404, proxy-cp-2 had it
    assert ("GET", config) in {(r.method, r.path) for r in first.received}


# -- -o table|wide|json|yaml, against proxy-cp's real answers -------------------------------


def test_list_wide_adds_the_replica_node_serial_and_age(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "console", Console(width=400))  # no cell folded
    table = trellis(state_dir, "proxy", "list", "-o", "table")
    wide = trellis(state_dir, "proxy", "list", "-o", "wide")
    body = json.loads(trellis(state_dir, "proxy", "list", "--json").stdout)

    assert table.exit_code == wide.exit_code == 0, table.output + wide.output
    extra = ["REPLICA", "NODE ID", "CERT SERIAL", "AGE"]
    assert not [column for column in extra if column in table.stdout]
    header = next(line for line in wide.stdout.splitlines() if "PROXY" in line)
    assert all(column in header for column in extra)
    for proxy in body["proxies"]:
        row = row_of(wide.stdout, proxy["proxy"])
        assert "│ proxy-cp " in row  # the replica it is connected to
        assert proxy["node_id"] in row
        assert proxy["serial"][:16] in row


def test_list_json_and_yaml_are_the_same_answer(state_dir: Path) -> None:
    as_json = trellis(state_dir, "proxy", "list", "-o", "json")
    as_yaml = trellis(state_dir, "proxy", "list", "-o", "yaml")

    assert as_json.exit_code == as_yaml.exit_code == 0, as_json.output + as_yaml.output
    assert as_json.stdout == trellis(state_dir, "proxy", "list", "--json").stdout
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)


def test_status_in_every_format_from_the_real_admin_app(
    state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "console", Console(width=400))  # no cell folded
    runs = {
        fmt: trellis(state_dir, "status", "-o", fmt) for fmt in ("table", "wide", "json", "yaml")
    }

    assert {fmt: r.exit_code for fmt, r in runs.items()} == dict.fromkeys(runs, 0), runs
    body = json.loads(runs["json"].stdout)
    assert [s["service"] for s in body["services"]] == ["proxy-cp"]
    assert body["mesh"]["connected_proxies"] == 3
    assert yaml.safe_load(runs["yaml"].stdout) == body
    assert runs["json"].stdout == trellis(state_dir, "status", "--json").stdout
    extra = ["VERSION", "GRPC", "PID", "CHECKS OK", "LOOPS DOWN", "RESTARTS"]
    assert not [column for column in extra if column in runs["table"].stdout]
    assert all(column in runs["wide"].stdout for column in extra)
    row = row_of(runs["wide"].stdout, "│ proxy-cp ")
    assert version.version() in row  # from proxy-cp's own /v1/status
    assert f" {os.getpid()} " in row  # the pid the state directory records
