"""Running the control plane's processes on one machine: start, watch, restart, stop.

``trellis up`` uses a :class:`Supervisor` to run each service as its own process, in order,
waiting for each to be ready before starting the next. A process that dies is restarted
with backoff; SIGINT/SIGTERM stop them all in reverse order (SIGTERM, then SIGKILL after a
grace period), and every child is also tied to the supervisor's life with
``PR_SET_PDEATHSIG`` so none is orphaned even if the supervisor is killed. Output of each
child goes to ``<state-dir>/logs/<name>.log`` and, prefixed by its name, to the terminal.

Log files rotate by size (:class:`RotatingFile`): ``<name>.log`` grows to ``max_bytes``,
then becomes ``<name>.log.1`` (the older ones shift up) and a new one starts; ``backups``
old files are kept. A mesh left running never fills its disk with logs: each process uses
at most about ``(backups + 1) * max_bytes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import re
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import httpx

from trellis_common.backoff import Backoff, RetryCallState, failure, retrying, start_over
from trellis_runtime import adminhttp

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], Awaitable[bool]]

_PR_SET_PDEATHSIG = 1

#: A child that dies is restarted after 0.5 s, doubling to 10 s while it keeps dying; one
#: that had run for longer than ``RESTART_FORGIVEN_AFTER`` seconds starts the count again.
RESTART_BACKOFF = Backoff(initial=0.5, maximum=10.0, jitter=0.0)
RESTART_FORGIVEN_AFTER = 30.0

DEFAULT_LOG_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_LOG_BACKUPS = 3

_SIZE = re.compile(r"(\d+)\s*([kmg]i?b?|b)?", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str) -> int:
    """``"10MiB"``, ``"512k"``, ``"1048576"``: a size in bytes (units are powers of 1024)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not a size: {text!r} (use a number of bytes, or e.g. 512KiB, 10MiB)")
    unit = (match.group(2) or "").lower()[:1]
    return int(match.group(1)) * _UNITS[unit]


@dataclass(frozen=True, slots=True)
class LogRotation:
    max_bytes: int = DEFAULT_LOG_MAX_BYTES
    backups: int = DEFAULT_LOG_BACKUPS

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"log max bytes must be at least 1, got {self.max_bytes}")
        if self.backups < 0:
            raise ValueError(f"log backups must be 0 or more, got {self.backups}")


DEFAULT_ROTATION = LogRotation()


class RotatingFile:
    """An append-only file of lines that rotates when it would grow past ``max_bytes``.

    A line is never split across files, so a line longer than ``max_bytes`` makes a file
    of its own. With ``backups`` 0 the file is truncated instead of kept.
    """

    def __init__(self, path: Path, rotation: LogRotation) -> None:
        self.path = path
        self._rotation = rotation
        self._file: BinaryIO = path.open("ab")
        self._size = self._file.tell()

    def write(self, data: bytes) -> None:
        if self._size and self._size + len(data) > self._rotation.max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        backups = self._rotation.backups
        for index in range(backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
        if backups:
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self.path.open("wb")
        self._size = 0

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> RotatingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def https_ready(url: str, state_dir: Path) -> ReadyCheck:
    """A service's ``/readyz`` over TLS, its certificate checked against the mesh's CA."""

    async def check() -> bool:
        try:
            context = adminhttp.mesh_context(state_dir, check_name=False)
            async with httpx.AsyncClient(timeout=1.0, verify=context) as client:
                return (await client.get(url)).status_code == 200
        except (httpx.HTTPError, OSError):  # OSError: no trust bundle yet
            return False

    return check


def tcp_ready(host: str, port: int) -> ReadyCheck:
    async def check() -> bool:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    return check


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class ProcessSpec:
    name: str
    argv: Sequence[str]
    ready: ReadyCheck
    ports: Sequence[int] = ()
    env: dict[str, str] = field(default_factory=dict)
    address: str = ""  # what the status table shows
    #: Run before each start (and restart): ``trellis up`` leaves a fresh join token.
    prepare: Callable[[], object] | None = None
    ready_timeout: float = 60.0
    #: The processes that must be ready before this one starts (names of other specs; one
    #: that is not supervised is not waited for): the services wait for Redis and
    #: certmanager, and start side by side after them.
    after: Sequence[str] = ()


@dataclass
class Child:
    spec: ProcessSpec
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    restarts: int = 0
    ready: bool = False
    pump: asyncio.Task[None] | None = None


class StartupError(Exception):
    pass


class _Exited(Exception):
    """A child process ended while the supervisor was not stopping it."""

    def __init__(self, code: int, uptime: float) -> None:
        super().__init__(f"exited with code {code} after {uptime:.1f}s")
        self.code = code
        self.uptime = uptime


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        log_dir: Path,
        echo: Callable[[str, str], None],
        grace: float = 10.0,
        rotation: LogRotation = DEFAULT_ROTATION,
        restart_backoff: Backoff = RESTART_BACKOFF,
    ) -> None:
        self.children = [Child(spec) for spec in specs]
        self._log_dir = log_dir
        self._restart_backoff = restart_backoff
        self._rotation = rotation
        self._echo = echo
        self._grace = grace
        self._stopping = False

    def preflight(self) -> None:
        busy = [
            f"{c.spec.name}: port {port}"
            for c in self.children
            for port in c.spec.ports
            if not port_free("127.0.0.1", port)
        ]
        if busy:
            raise StartupError(
                "ports already in use (is another mesh running? `trellis status`): "
                + ", ".join(busy)
            )

    async def _spawn(self, child: Child) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        if child.spec.prepare is not None:
            child.spec.prepare()
        env = {**os.environ, **child.spec.env, "PYTHONUNBUFFERED": "1"}
        child.process = await asyncio.create_subprocess_exec(
            *child.spec.argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with_parent,
            start_new_session=True,
        )
        child.started_at = time.monotonic()
        child.ready = False
        child.pump = asyncio.create_task(self._pump(child, child.process))

    async def _pump(self, child: Child, process: asyncio.subprocess.Process) -> None:
        """Copy the child's output to its log file and the terminal, line by line, until
        it ends. A line longer than the stream's buffer (a long traceback on one line) is
        copied in pieces: the pump must never stop, or the child blocks on a full pipe."""
        assert process.stdout is not None
        with RotatingFile(self._log_dir / f"{child.spec.name}.log", self._rotation) as sink:
            while True:
                try:
                    line = await process.stdout.readuntil(b"\n")
                except asyncio.IncompleteReadError as end:
                    line = end.partial  # the output ended (without a last newline)
                except asyncio.LimitOverrunError as long:
                    line = await process.stdout.readexactly(long.consumed)
                if not line:
                    return
                sink.write(line)
                self._echo(child.spec.name, line.decode(errors="replace").rstrip())

    async def _wait_ready(self, child: Child) -> None:
        deadline = time.monotonic() + child.spec.ready_timeout
        while time.monotonic() < deadline:
            assert child.process is not None
            if child.process.returncode is not None:
                raise StartupError(
                    f"{child.spec.name} exited with code {child.process.returncode} while "
                    f"starting; see {self._log_dir / (child.spec.name + '.log')}"
                )
            if await child.spec.ready():
                child.ready = True
                return
            await asyncio.sleep(0.1)
        raise StartupError(f"{child.spec.name} not ready after {child.spec.ready_timeout:.0f}s")

    async def start(self) -> None:
        """Start every child as soon as those it comes ``after`` are ready, and wait until
        all are ready; the first that fails to start ends the others' waiting."""
        await self._bring_up(self.children)

    async def launch(self, specs: Sequence[ProcessSpec]) -> None:
        """Start more processes (before :meth:`run`), as :meth:`start` does."""
        children = [Child(spec) for spec in specs]
        self.children += children
        await self._bring_up(children)

    async def _bring_up(self, children: Sequence[Child]) -> None:
        ready = {child.spec.name: child.ready for child in self.children}
        started = {name: asyncio.Event() for name in ready}
        for name, is_ready in ready.items():
            if is_ready:
                started[name].set()

        async def bring_up(child: Child) -> None:
            for name in child.spec.after:
                if name in started:
                    await started[name].wait()
            await self._spawn(child)
            await self._wait_ready(child)
            started[child.spec.name].set()

        starting = [asyncio.create_task(bring_up(child)) for child in children]
        try:
            await asyncio.gather(*starting)
        except BaseException:
            for task in starting:
                task.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
            raise

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the children until ``stop``; restart any that dies; then stop them all."""
        try:
            watchers = [asyncio.create_task(self._watch(c, stop)) for c in self.children]
            await stop.wait()
        finally:
            self._stopping = True
            for task in watchers:
                task.cancel()
            await self.stop_all()

    async def _watch(self, child: Child, stop: asyncio.Event) -> None:
        def exited(state: RetryCallState) -> None:
            error = failure(state)
            assert isinstance(error, _Exited)
            child.restarts += 1
            self._echo(
                "trellis",
                f"{child.spec.name} exited (code {error.code}) after {error.uptime:.1f}s; "
                f"restarting in {state.upcoming_sleep:.1f}s (restart #{child.restarts})",
            )

        async for attempt in retrying(stop, self._restart_backoff, on=_Exited, before_sleep=exited):
            if self._stopping or stop.is_set():
                return
            with attempt:
                assert child.process is not None
                if child.process.returncode is not None:  # it died: start it again
                    await self._spawn(child)
                    try:
                        await self._wait_ready(child)
                        self._echo("trellis", f"{child.spec.name} is ready again")
                    except StartupError as exc:
                        self._echo("trellis", str(exc))
                    assert child.process is not None
                code = await child.process.wait()
                if self._stopping or stop.is_set():
                    return
                uptime = time.monotonic() - child.started_at
                if uptime > RESTART_FORGIVEN_AFTER:
                    start_over(attempt)  # it ran well: restart it quickly
                raise _Exited(code, uptime)

    async def stop_all(self) -> None:
        for child in reversed(self.children):
            process = child.process
            if process is None or process.returncode is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), self._grace)
            except TimeoutError:
                self._echo("trellis", f"{child.spec.name} ignored SIGTERM; killing it")
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            if child.pump is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await child.pump
