"""Where the tests' Redis runs: in a container when a Docker engine answers, else locally.

This is the one place the choice is made. Contributors' machines mostly have a Docker
engine and no ``redis-server``; our CI machines have the binary and no engine. Both paths
give the tests the same object, a :class:`~trellis_testing.redis_server.RedisServer`:
the same port on 127.0.0.1, the same data directory (bind-mounted into the container as
``/data``), the same ACL users and password files, and the same faults (``kill`` is
``docker kill``, ``pause`` is ``docker pause``, ``start`` after ``kill`` comes back with the
append-only file, ``wipe`` deletes it).

``TRELLIS_TEST_REDIS`` chooses: ``auto`` (the default: a container if testcontainers reaches
an engine, else the local binary), ``local`` or ``container`` (an error if no engine). The
pytest header says which path ran (:func:`describe`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import signal
import socket
from pathlib import Path
from typing import Any

from trellis_testing.redis_server import RedisServer, RedisServerError, find_redis_server

VARIABLE = "TRELLIS_TEST_REDIS"
#: The image a container runs: the Redis release our Debian machines have (7.x, ACL files).
IMAGE = os.environ.get("TRELLIS_TEST_REDIS_IMAGE", "redis:7.4")
#: Where the data directory is mounted in the container.
DATA = "/data"


DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def docker_engine() -> bool:
    """Whether testcontainers is installed and a Docker engine answers ``GET /_ping`` within
    two seconds at ``DOCKER_HOST`` (default: the local socket). Asked over a plain socket:
    the Docker SDK's client, made only to ask, leaves its socket open when no engine is
    there."""
    if importlib.util.find_spec("testcontainers") is None:
        return False
    host = os.environ.get("DOCKER_HOST", DEFAULT_DOCKER_HOST)
    try:
        if host.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            try:
                sock.connect(host.removeprefix("unix://"))
            except OSError:
                sock.close()
                raise
        elif host.startswith("tcp://"):
            name, _, port = host.removeprefix("tcp://").rstrip("/").rpartition(":")
            sock = socket.create_connection((name, int(port)), timeout=2)
        else:
            return False  # ssh:// and the like: not tried
        with sock:
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            answer = sock.recv(1024)
    except (OSError, ValueError):
        return False
    return answer.startswith(b"HTTP/1.") and b" 200 " in answer.split(b"\r\n", 1)[0]


@functools.cache
def backend() -> str:
    """``container`` or ``local``, once per process."""
    chosen = os.environ.get(VARIABLE, "auto")
    if chosen not in ("auto", "local", "container"):
        raise RedisServerError(f"{VARIABLE}={chosen!r}: use auto, local or container")
    if chosen == "local":
        return "local"
    if docker_engine():
        return "container"
    if chosen == "container":
        raise RedisServerError(f"{VARIABLE}=container, but no Docker engine answers")
    return "local"


def redis_server(dir: Path | str | None = None, **options: Any) -> RedisServer:
    """A Redis for a test (not started), on the path :func:`backend` chose."""
    if backend() == "container":
        return ContainerRedisServer(dir=dir, **options)
    return RedisServer(dir=dir, **options)


def describe() -> str:
    """One line for the pytest header: which path runs the tests' Redis."""
    chosen = os.environ.get(VARIABLE, "auto")
    if backend() == "container":
        return f"redis: containers of {IMAGE} through testcontainers ({VARIABLE}={chosen})"
    return f"redis: the local {find_redis_server()} ({VARIABLE}={chosen}; no Docker engine used)"


class ContainerRedisServer(RedisServer):
    """A :class:`RedisServer` run by testcontainers: ``redis-server`` with the same options
    in a container, its port published on 127.0.0.1 and its data directory mounted."""

    _container: Any = None

    def _find_binary(self) -> str:
        return "redis-server"  # the image's

    def container_command(self) -> list[str]:
        """The container's command: the image's redis-server with our options."""
        return ["redis-server", *self.server_args(bind="0.0.0.0", port=6379, dir=DATA)]

    def _launch(self) -> None:
        from testcontainers.core.container import DockerContainer

        self.dir.chmod(0o777)  # the image's redis user writes the append-only file here
        container = (
            DockerContainer(IMAGE)
            # the Docker SDK takes (address, port) for a host port: the loopback only
            .with_bind_ports(6379, ("127.0.0.1", self.port))  # type: ignore[arg-type]
            .with_volume_mapping(str(self.dir.resolve()), DATA, "rw")
            .with_command(self.container_command())
        )
        self._container = container.start()

    def _state(self) -> dict[str, Any]:
        if self._container is None:
            return {}
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        state: dict[str, Any] = wrapped.attrs.get("State", {})
        return state

    def _exit_code(self) -> int | None:
        state = self._state()
        if not state or state.get("Running"):
            return None
        return int(state.get("ExitCode", 0))

    @property
    def running(self) -> bool:
        return bool(self._state().get("Running"))

    def _signal_and_wait(self, signum: signal.Signals, timeout: float) -> None:
        container, self._container = self._container, None
        if container is None:
            return
        wrapped = container.get_wrapped_container()
        with contextlib.suppress(Exception):
            wrapped.unpause()  # a paused server cannot handle SIGTERM
        with contextlib.suppress(Exception):
            if signum == signal.SIGKILL:
                wrapped.kill()
            else:
                wrapped.stop(timeout=int(timeout))
        with contextlib.suppress(Exception):
            wrapped.remove(force=True)

    def pause(self) -> None:
        """``docker pause``: the published port still accepts connections, nothing answers."""
        if self._container is not None:
            self._container.get_wrapped_container().pause()

    def resume(self) -> None:
        if self._container is not None:
            self._container.get_wrapped_container().unpause()
