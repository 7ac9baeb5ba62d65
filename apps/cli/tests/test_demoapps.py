"""The demo's programs: they answer, count, and stop on SIGTERM (the supervisor's signal)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from trellis_cli.demoapps import outcome
from trellis_testing.ports import free_port


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def test_the_app_answers_with_its_name_and_stops_on_sigterm() -> None:
    port = free_port()
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trellis_cli.demoapps",
            "app",
            "--name",
            "bookstore-v1",
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
        body = httpx.get(
            f"http://127.0.0.1:{port}/books-bought",
            headers={"x-forwarded-client-cert": "URI=spiffe://cluster.local/ns/a/sa/b"},
        ).json()
        assert body == {
            "app": "bookstore-v1",
            "path": "/books-bought",
            "caller": "URI=spiffe://cluster.local/ns/a/sa/b",
        }
        app.send_signal(signal.SIGTERM)
        assert app.wait(5) == 0  # no 10 s grace and SIGKILL from the supervisor
    finally:
        if app.poll() is None:
            app.kill()
        app.wait(5)


def test_the_client_counts_what_it_gets(tmp_path: Path) -> None:
    app_port = free_port()
    app = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trellis_cli.demoapps",
            "app",
            "--name",
            "v1",
            "--port",
            str(app_port),
        ],
        stdout=subprocess.DEVNULL,
    )
    counter = tmp_path / "buyer.json"
    client = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trellis_cli.demoapps",
            "client",
            "--name",
            "buyer",
            "--proxy-port",
            str(app_port),
            "--host",
            "bookstore",
            "--counter",
            str(counter),
            "--rate",
            "50",
        ],
    )
    try:
        wait_listening(app_port)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if counter.exists() and json.loads(counter.read_text())["counts"].get("v1", 0) >= 5:
                break
            time.sleep(0.1)
        assert json.loads(counter.read_text())["counts"]["v1"] >= 5
        client.send_signal(signal.SIGTERM)
        assert client.wait(5) == 0
    finally:
        for process in (client, app):
            if process.poll() is None:
                process.kill()
            process.wait(5)


def test_outcomes() -> None:
    request = httpx.Request("GET", "http://x/")
    assert outcome(httpx.Response(200, json={"app": "v2"}, request=request)) == "v2"
    assert outcome(httpx.Response(403, request=request)) == "denied"
    assert outcome(httpx.Response(404, request=request)) == "denied"
    assert outcome(httpx.Response(503, request=request)) == "http-503"
