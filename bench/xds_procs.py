"""The xDS benchmark's child processes: servers (``python -m bench.xds_server``), replicas of
one, and client workers (``python -m bench.xds_clients``).

:class:`Child` runs ``python -m MODULE ARGS`` and speaks the line protocol they share: a
command per line on stdin, one JSON answer per line on stdout (the first, unasked, says it
is ready), logs on stderr into a file. :class:`ServerProcess` is one server;
:class:`Replicas` runs several ``trellis`` ones behind the same interface, as proxy-cp
replicas, each on a port of its own: the client spreads its connections over
:attr:`Replicas.targets` evenly, as a load balancer would (on one shared ``SO_REUSEPORT``
port, as ``trellis up --proxy-cp-replicas`` runs them, the kernel's hash of each connection
decides, and a few connections leave one replica with more than its share: that measures
the hash, not proxy-cp).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from bench import load

START_TIMEOUT = 60.0
ROOT = Path(__file__).resolve().parent.parent  # where ``python -m bench.xds_server`` works
ANSWER_LIMIT = 64 * 1024 * 1024  # a client worker's answer carries a latency per stream


class Child:
    """``python -m MODULE ARGS`` as an async context manager (see the module docstring)."""

    def __init__(self, module: str, args: list[str], log_path: Path, label: str) -> None:
        self.kind = label
        self.log_path = log_path
        self.hello: dict[str, Any] = {}  # the child's first line
        self._argv = ["-m", module, *args]
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def __aenter__(self) -> Child:
        try:
            with self.log_path.open("wb") as log_file:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    *self._argv,
                    cwd=ROOT,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log_file,
                    limit=ANSWER_LIMIT,
                )
            self.hello = await self._read(START_TIMEOUT)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if exc_info[1] is not None:
            lines = self.log_path.read_text(errors="replace").splitlines()
            problems = [line for line in lines if "level=info" not in line]
            shown = "\n".join([*problems[:20], "...", *lines[-5:]])
            print(f"{self.kind} log, problems and last lines:\n{shown}", file=sys.stderr)
        await self.close()

    async def command(self, line: str, timeout: float = 60.0) -> dict[str, Any]:
        assert self._process is not None
        assert self._process.stdin is not None
        self._process.stdin.write(line.encode() + b"\n")
        await self._process.stdin.drain()
        answer = await self._read(timeout)
        if "error" in answer:
            raise RuntimeError(f"{self.kind}: {answer['error']}")
        return answer

    async def _read(self, timeout: float) -> dict[str, Any]:
        assert self._process is not None
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"{self.kind} exited (see {self.log_path})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def cpu(self) -> float:
        seconds = load.cpu_seconds(self.pid)
        if seconds is None:
            raise RuntimeError(f"no /proc/{self.pid}/stat: CPU time needs Linux")
        return seconds

    def rss(self) -> int:
        """Resident set size in bytes, from ``/proc/<pid>/status``."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no VmRSS in /proc/{self.pid}/status")

    async def close(self) -> None:
        """Close stdin (the child stops), then SIGTERM and SIGKILL if it lingers."""
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        for signal in (None, process.terminate, process.kill):
            if signal is not None:
                signal()
            try:
                await asyncio.wait_for(process.wait(), 10)
                return
            except TimeoutError:
                continue


class ServerProcess(Child):
    """``python -m bench.xds_server KIND GROUPS [PORT]``: one server, on :attr:`port`."""

    def __init__(
        self, kind: str, groups: int, log_dir: Path, port: int = 0, label: str = ""
    ) -> None:
        name = label or kind
        super().__init__(
            "bench.xds_server", [kind, str(groups), str(port)], log_dir / f"{name}.log", name
        )
        self.port = port

    async def __aenter__(self) -> ServerProcess:
        await super().__aenter__()
        self.port = int(self.hello["port"])
        return self

    @property
    def targets(self) -> list[str]:
        return [f"127.0.0.1:{self.port}"]

    async def until(self, stat: str, value: int, timeout: float = 30.0) -> dict[str, Any]:
        return await _until(self, stat, value, timeout)

    async def spread(self) -> list[int]:
        """The streams each process serves (here one)."""
        return [int((await self.command("stats"))["streams"])]


class Replicas:
    """``count`` trellis server processes, as proxy-cp replicas, each on its own port: each
    follows the changes on its own (every command goes to all of them), and the client
    spreads its connections over :attr:`targets`. Stats, CPU and RSS are summed; a push's
    ``set_s`` and the loop's worst stall are the slowest replica's."""

    def __init__(self, count: int, groups: int, log_dir: Path, kind: str = "replicas") -> None:
        self.kind = kind
        self._count, self._groups, self._log_dir = count, groups, log_dir
        self._stack = AsyncExitStack()
        self.members: list[ServerProcess] = []

    async def __aenter__(self) -> Replicas:
        async with AsyncExitStack() as stack:
            for index in range(self._count):
                label = f"{self.kind}-{index + 1}"
                member = ServerProcess("trellis", self._groups, self._log_dir, 0, label)
                self.members.append(await stack.enter_async_context(member))
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(kind, error, trace)

    @property
    def targets(self) -> list[str]:
        return [target for member in self.members for target in member.targets]

    async def command(self, line: str, timeout: float = 60.0) -> dict[str, Any]:
        lines = [line] * len(self.members)
        if line.startswith("profile stop "):  # a profile file per replica
            lines = [f"{line}.{index + 1}" for index in range(len(self.members))]
        answers = await asyncio.gather(
            *(m.command(text, timeout) for m, text in zip(self.members, lines, strict=True))
        )
        merged: dict[str, Any] = {}
        for answer in answers:
            for key, value in answer.items():
                merged[key] = (
                    max(merged.get(key, 0), value)
                    if key in ("set_s", "lag_max_s")  # the slowest replica's
                    else (merged.get(key, 0) + value)
                )
        return merged

    async def until(self, stat: str, value: int, timeout: float = 30.0) -> dict[str, Any]:
        return await _until(self, stat, value, timeout)

    async def spread(self) -> list[int]:
        """The streams each replica serves."""
        return [count for member in self.members for count in await member.spread()]

    def cpu(self) -> float:
        return sum(m.cpu() for m in self.members)

    def rss(self) -> int:
        return sum(m.rss() for m in self.members)


Server = ServerProcess | Replicas


async def _until(server: Server, stat: str, value: int, timeout: float) -> dict[str, Any]:
    """Poll ``stats`` until ``stat`` reaches ``value``; return the last answer."""
    deadline = time.monotonic() + timeout
    while (stats := await server.command("stats"))[stat] < value:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.kind} server: {stat} {stats[stat]}, expected {value}")
        await asyncio.sleep(0.01)
    return stats
