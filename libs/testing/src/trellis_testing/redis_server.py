"""A real ``redis-server`` process for tests, that can be killed and brought back.

Tests of signaling and of anything that survives a Redis restart need the real thing:
a server on 127.0.0.1 with an append-only file fsynced on every write, so that
``kill()`` (SIGKILL) followed by ``start()`` on the same port and directory comes back
with the data, like a production Redis with persistence. ``wipe()`` between the two
simulates a Redis that lost its data. ``pause()``/``resume()`` (SIGSTOP/SIGCONT) make a
server that accepts TCP connections but never answers, like a dead network path.

Like the Redis ``trellis up`` runs, it rewrites its append-only file once the file has
grown by ``aof_rewrite_percentage`` since the last rewrite and is at least
``aof_rewrite_min_size`` (Redis' defaults, 100 and ``64mb``; tests of the rewrite pass a
small size).

Like that Redis too, it has the ACL on (:mod:`trellis_runtime.redisacl`): the default user
is off and each component has its own user, with a password file in ``<dir>/users/``
(kept across restarts and :meth:`RedisServer.wipe`). :attr:`RedisServer.url` logs in as
``admin``, the operator's user, so a test can read and plant anything; a service process
is given its own user (:meth:`RedisServer.service_env`), and :meth:`RedisServer.target`
connects as one component, to see what it may and may not do.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from trellis_runtime import redisacl
from trellis_runtime.redisconn import RedisTarget
from trellis_testing.ports import free_port


class RedisServerError(RuntimeError):
    """redis-server is missing, or did not start."""


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RedisServerError(
            "redis-server not found on PATH: install it (Debian/Ubuntu: apt-get install "
            "redis-server) to run the tests that need a real Redis"
        )
    return path


def _answers_ping(port: int, login: bytes = b"") -> bool:
    """PING answered (after ``login``, an inline AUTH, whose +OK comes first)."""
    expected = b"+OK\r\n+PONG" if login else b"+PONG"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(login + b"PING\r\n")
            answer = b""
            while len(answer) < len(expected):
                chunk = sock.recv(64)
                if not chunk:
                    break
                answer += chunk
            return answer.startswith(expected)
    except OSError:
        return False


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 with AOF persistence in ``dir``.

    Without ``port`` a free one is picked at the first ``start()`` and kept for restarts;
    without ``dir`` a temporary directory is made and removed by ``close()``.
    """

    def __init__(
        self,
        port: int | None = None,
        dir: Path | str | None = None,
        *,
        startup_timeout: float = 10.0,
        aof_rewrite_percentage: int = 100,
        aof_rewrite_min_size: str = "64mb",
        acl: bool = True,
        users_dir: Path | None = None,
        users: tuple[str, ...] | None = None,
    ) -> None:
        self._binary = self._find_binary()
        self._fixed_port = port is not None
        self.port = port if port is not None else free_port()
        self._own_dir = dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="trellis-redis-") if dir is None else dir)
        self._startup_timeout = startup_timeout
        self.aof_rewrite_percentage = aof_rewrite_percentage
        self.aof_rewrite_min_size = aof_rewrite_min_size
        self._process: subprocess.Popen[bytes] | None = None
        self.acl = acl
        #: the password files (several servers of one set share them)...
        self.users_dir = self.dir / "users" if users_dir is None else users_dir
        #: ...of these users (None: admin and every component)
        self.users = users
        self.aclfile = self.dir / "users.acl"

    def _find_binary(self) -> str:
        return find_redis_server()

    @property
    def plain_url(self) -> str:
        """The URL without credentials (a client on it is refused: NOAUTH)."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def url(self) -> str:
        """The URL as ``admin`` (every key and command), or plain without the ACL."""
        if not self.acl:
            return self.plain_url
        return f"redis://{redisacl.ADMIN}:{self.password(redisacl.ADMIN)}@127.0.0.1:{self.port}/0"

    def password_file(self, user: str) -> Path:
        return self.users_dir / user

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def target(self, user: str) -> RedisTarget:
        """Where to connect as ``user`` (a component of the ACL table, or ``admin``)."""
        return RedisTarget.create(self.plain_url, user, self.password_file(user))

    def service_env(self, component: str) -> dict[str, str]:
        """The environment a service process needs to log in as ``component``."""
        if not self.acl:
            return {"TRELLIS_REDIS_URL": self.plain_url}
        return {
            "TRELLIS_REDIS_URL": self.plain_url,
            "TRELLIS_REDIS_USERNAME": component,
            "TRELLIS_REDIS_PASSWORD_FILE": str(self.password_file(component)),
        }

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def log_path(self) -> Path:
        return self.dir / "redis.log"

    def start(self) -> None:
        """Start the server (again, on the same port and dir) and wait until it answers."""
        if self.running:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            try:
                self._start_once()
                return
            except RedisServerError:
                # Someone took the port we picked between probing and binding: pick again.
                if self._fixed_port or attempt == 2:
                    raise
                self.port = free_port()

    def server_args(self, *, bind: str, port: int, dir: str) -> list[str]:
        """redis-server's options (after the binary), where it binds and keeps its data
        (``dir`` also holds its log and ACL file): the same for a local process and a
        container, which sees ``dir`` under another path."""
        args = [
            "--bind", bind,
            "--port", str(port),
            "--save", "",
            "--appendonly", "yes",
            "--appendfsync", "always",
            "--auto-aof-rewrite-percentage", str(self.aof_rewrite_percentage),
            "--auto-aof-rewrite-min-size", self.aof_rewrite_min_size,
            "--dir", dir,
            "--logfile", f"{dir}/{self.log_path.name}",
            "--daemonize", "no",
        ]  # fmt: skip
        if self.acl:
            args += ["--aclfile", f"{dir}/{self.aclfile.name}"]
        return args

    def config_args(self) -> list[str]:
        """What comes before the options on the command line: a config file, for a server
        that has one (a Redis of a Sentinel set)."""
        return []

    def _launch(self) -> None:
        """Start the server (it is then waited for)."""
        args = self.server_args(bind="127.0.0.1", port=self.port, dir=str(self.dir))
        self._process = subprocess.Popen(
            [self._binary, *self.config_args(), *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _exit_code(self) -> int | None:
        """The server's exit code, None while it runs."""
        return None if self._process is None else self._process.poll()

    def prepare(self) -> bytes:
        """Write what the server reads at start (its ACL); return the inline login with
        which it is then PINGed (empty: none)."""
        if not self.acl:
            return b""
        files = redisacl.ensure_passwords(self.users_dir, self.users)
        redisacl.write_aclfile(self.aclfile, files)
        return f"AUTH {redisacl.ADMIN} {self.password(redisacl.ADMIN)}\r\n".encode()

    def _start_once(self) -> None:
        login = self.prepare()
        self._launch()
        deadline = time.monotonic() + self._startup_timeout
        while not _answers_ping(self.port, login):
            code = self._exit_code()
            if code is not None or time.monotonic() > deadline:
                self.kill()
                raise RedisServerError(
                    f"redis-server on port {self.port} did not start (exit code {code}); "
                    f"log tail:\n{self._log_tail()}"
                )
            time.sleep(0.005)

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 10.0) -> None:
        """Shut down cleanly (SIGTERM) and wait for the process to exit."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL: no shutdown, clients see their connections reset."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def _signal_and_wait(self, signum: signal.Signals, timeout: float) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGCONT)  # a paused server cannot handle SIGTERM
                process.send_signal(signum)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def pause(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing is answered."""
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            os.kill(self._process.pid, signal.SIGCONT)

    def wipe(self) -> None:
        """Delete the persisted data (the server must be stopped): a Redis that lost it all."""
        if self.running:
            raise RedisServerError("stop or kill the server before wiping its data")
        for entry in self.dir.iterdir():
            if entry in (self.users_dir, self.aclfile):
                continue  # the users are configuration, not data
            if entry.is_dir():
                shutil.rmtree(entry)
            elif entry != self.log_path:
                entry.unlink()

    def close(self) -> None:
        """Kill the server and remove a directory this object made."""
        self.kill()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
