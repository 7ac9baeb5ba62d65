"""The one place the tests' Redis is chosen: a container where a Docker engine answers, else
the local binary; both are the same RedisServer to a test.

This machine has no Docker engine, so the container itself is not started here: the
choice, the refusal of a container without an engine, and the container's command (the
local server's options, with its paths inside the container) are.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trellis_testing import redis_backend
from trellis_testing.ports import free_port
from trellis_testing.redis_server import RedisServer, RedisServerError


@pytest.fixture(autouse=True)
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The choice is made once per process: forget it around each test."""
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # surely no engine
    redis_backend.backend.cache_clear()
    yield
    redis_backend.backend.cache_clear()


def test_without_an_engine_auto_and_local_run_the_local_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert not redis_backend.docker_engine()
    for chosen in ("auto", "local"):
        monkeypatch.setenv(redis_backend.VARIABLE, chosen)
        redis_backend.backend.cache_clear()
        assert redis_backend.backend() == "local"
        server = redis_backend.redis_server(tmp_path / chosen)
        assert type(server) is RedisServer
        assert "the local" in redis_backend.describe()
        assert f"{redis_backend.VARIABLE}={chosen}" in redis_backend.describe()


def test_a_container_asked_for_without_an_engine_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(redis_backend.VARIABLE, "container")
    with pytest.raises(RedisServerError, match="no Docker engine answers"):
        redis_backend.backend()


def test_an_engine_is_one_that_answers_a_ping(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A socket that answers 200 to GET /_ping is an engine; one that answers otherwise, or
    nothing at all, is not."""

    def serve(answer: bytes) -> str:
        path = tmp_path / f"{len(answer)}.sock"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen()

        def reply() -> None:
            with server, server.accept()[0] as connection:
                assert connection.recv(1024).startswith(b"GET /_ping HTTP/1.0")
                connection.sendall(answer)

        threading.Thread(target=reply, daemon=True).start()
        return f"unix://{path}"

    monkeypatch.setenv("DOCKER_HOST", serve(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"))
    assert redis_backend.docker_engine()
    monkeypatch.setenv("DOCKER_HOST", serve(b"HTTP/1.1 500 Internal Server Error\r\n\r\n"))
    assert not redis_backend.docker_engine()
    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{free_port()}")  # nothing listens
    assert not redis_backend.docker_engine()


def test_an_unknown_choice_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(redis_backend.VARIABLE, "podman")
    with pytest.raises(RedisServerError, match="'podman': use auto, local or container"):
        redis_backend.backend()


def test_the_container_runs_the_local_servers_options_on_its_own_paths(tmp_path: Path) -> None:
    local = RedisServer(dir=tmp_path / "local", aof_rewrite_min_size="64kb")
    container = redis_backend.ContainerRedisServer(
        dir=tmp_path / "container", aof_rewrite_min_size="64kb"
    )
    command = container.container_command()
    assert command[0] == "redis-server"
    expected = local.server_args(bind="0.0.0.0", port=6379, dir=redis_backend.DATA)
    assert command[1:] == expected
    options = dict(zip(expected[::2], expected[1::2], strict=True))
    assert options["--aclfile"] == "/data/users.acl"
    assert options["--dir"] == "/data"
    assert options["--appendonly"] == "yes"
    assert options["--auto-aof-rewrite-min-size"] == "64kb"
    assert not container.running  # nothing started: no engine was asked
