"""The xDS benchmark's server processes: one (``python -m bench.xds_server``), or replicas.

:class:`ServerProcess` runs ``python -m bench.xds_server KIND GROUPS [PORT]`` and speaks
its stdin/stdout protocol; :class:`Replicas` runs several ``trellis`` ones on one port
(``SO_REUSEPORT``), as proxy-cp replicas, behind the same interface.
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


class ServerProcess:
    """``python -m bench.xds_server KIND GROUPS [PORT]`` as an async context manager."""

    def __init__(
        self, kind: str, groups: int, log_dir: Path, port: int = 0, label: str = ""
    ) -> None:
        self.kind = kind
        self.groups = groups
        self.log_path = log_dir / f"{label or kind}.log"
        self.port = port
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def __aenter__(self) -> ServerProcess:
        try:
            with self.log_path.open("wb") as log_file:
                self._process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.xds_server",
                    self.kind,
                    str(self.groups),
                    str(self.port),
                    cwd=ROOT,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=log_file,
                )
            self.port = int((await self._read(START_TIMEOUT))["port"])
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if exc_info[1] is not None:
            lines = self.log_path.read_text(errors="replace").splitlines()
            problems = [line for line in lines if "level=info" not in line]
            shown = "\n".join([*problems[:20], "...", *lines[-5:]])
            print(f"{self.kind} server log, problems and last lines:\n{shown}", file=sys.stderr)
        await self.close()

    async def command(self, line: str, timeout: float = 60.0) -> dict[str, Any]:
        assert self._process is not None
        assert self._process.stdin is not None
        self._process.stdin.write(line.encode() + b"\n")
        await self._process.stdin.drain()
        answer = await self._read(timeout)
        if "error" in answer:
            raise RuntimeError(f"{self.kind} server: {answer['error']}")
        return answer

    async def _read(self, timeout: float) -> dict[str, Any]:
        assert self._process is not None
        assert self._process.stdout is not None
        line = await asyncio.wait_for(self._process.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"the {self.kind} server exited (see {self.log_path})")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def until(self, stat: str, value: int, timeout: float = 30.0) -> dict[str, Any]:
        return await _until(self, stat, value, timeout)

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
        """Close stdin (the server stops), then SIGTERM and SIGKILL if it lingers."""
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


class Replicas:
    """``count`` trellis server processes on one port (SO_REUSEPORT), as proxy-cp replicas:
    each follows the changes on its own (every command goes to all of them), and the
    kernel spreads the client's connections over them. Stats, CPU and RSS are summed; a
    push's ``set_s`` is the slowest replica's."""

    kind = "replicas"

    def __init__(self, count: int, groups: int, log_dir: Path) -> None:
        self._count, self._groups, self._log_dir = count, groups, log_dir
        self._stack = AsyncExitStack()
        self.members: list[ServerProcess] = []
        self.port = 0

    async def __aenter__(self) -> Replicas:
        async with AsyncExitStack() as stack:
            for index in range(self._count):
                member = ServerProcess(
                    "trellis", self._groups, self._log_dir, self.port, f"replica-{index + 1}"
                )
                self.members.append(await stack.enter_async_context(member))
                self.port = self.port or member.port
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(kind, error, trace)

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
