"""The xDS benchmark's simulated Envoys: in the benchmark's own process, or over C workers.

The streams of one server (a *kind*: ``trellis``, ``floor``, ``replicas``...) are N global
indices; stream ``i`` is proxy ``i`` of :mod:`bench.xds_mesh` (group ``i % GROUPS``).
With C client processes, worker ``w`` holds the streams ``w, w + C, w + 2C, ...``
(:class:`Shard`), each worker's streams ``per_channel`` to a connection; connection ``c``
of worker ``w`` is the global connection ``c * C + w`` and goes to the server target
``(c * C + w) % R`` of the R the server has (R replicas, each on its own port): the
connections are spread evenly over the replicas.

:class:`LocalClients` (no ``--clients``: today's layout) is one shard in this process;
:class:`WorkerClients` runs C ``python -m bench.xds_clients WORKER C GROUPS PER_CHANNEL``
processes (:class:`bench.xds_procs.Child`), each a shard that answers these commands:
``add KIND N TARGET,...``, ``connect KIND UPTO TIMEOUT`` (open its streams of the global
indices below ``UPTO``, until all its streams are synced), ``begin KIND ROUND`` and ``wait
KIND TIMEOUT`` (the round's latencies). Every process reads the same monotonic clock, so a
worker's latencies are moved onto the coordinator's start of the round: the clock starts
where it does in one process, right before the trigger.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc

from bench import xds_client, xds_mesh, xds_server
from bench.xds_procs import Child


@dataclass(frozen=True, slots=True)
class Synced:
    """After a connect: how long it took (the coordinator's wall time), and the streams
    refused and retried so far (the first refusal's reason)."""

    seconds: float
    retries: int
    reason: str


@dataclass(frozen=True, slots=True)
class Round:
    """One round's figures from every stream of one server."""

    latencies: list[float]  # seconds from the trigger to each stream's EDS ACK
    responses: Counter[str] = field(default_factory=Counter)  # by type URL
    duplicates: int = 0


class Clients(Protocol):
    """The simulated Envoys of every server of one N."""

    async def add(self, kind: str, targets: Sequence[str], streams: int) -> None: ...
    async def connect(self, kind: str, upto: int, timeout: float) -> Synced: ...
    async def begin(self, kind: str, round_: int) -> None: ...
    async def wait(self, kind: str, timeout: float) -> Round: ...
    def cpu(self) -> float: ...


class Shard:
    """Worker ``worker`` of ``workers``: a :class:`bench.xds_client.Fleet` per server of
    its share of the streams (see the module docstring)."""

    def __init__(self, worker: int, workers: int, groups: int, per_channel: int) -> None:
        self.worker, self.workers = worker, workers
        self.groups, self.per_channel = groups, per_channel
        self.fleets: dict[str, xds_client.Fleet] = {}
        self._opened: dict[str, int] = {}

    def add(self, kind: str, targets: Sequence[str], streams: int) -> None:
        share = range(self.worker, streams, self.workers)

        def channel_of(local: int) -> grpc.aio.Channel:
            connection = local // self.per_channel * self.workers + self.worker
            target = targets[connection % len(targets)]
            return grpc.aio.insecure_channel(target, xds_client.CHANNEL_OPTIONS)

        self.fleets[kind] = xds_client.Fleet(
            f"{kind} ({','.join(targets)}; client {self.worker + 1} of {self.workers})",
            len(share),
            self.groups,
            self.per_channel,
            node_id=lambda local: xds_mesh.node_id(share[local], self.groups),
            channel_of=channel_of,
        )
        self._opened[kind] = 0

    async def connect(self, kind: str, upto: int, timeout: float) -> Synced:
        fleet = self.fleets[kind]
        wanted = len(range(self.worker, upto, self.workers))
        seconds = await fleet.connect(wanted - self._opened[kind], timeout)
        self._opened[kind] = wanted
        return Synced(seconds, fleet.retries, str(fleet.retry_reason or "")[:160])

    def begin(self, kind: str, round_: int) -> float:
        """Start the round; return when (the monotonic clock)."""
        self.fleets[kind].begin(round_)
        return self.fleets[kind].started

    async def wait(self, kind: str, timeout: float) -> Round:
        fleet = self.fleets[kind]
        latencies = await fleet.wait(timeout) if fleet.size else []
        return Round(list(latencies), Counter(fleet.responses), fleet.duplicates)

    async def close(self) -> None:
        for fleet in self.fleets.values():
            await fleet.close()


class LocalClients:
    """Every stream in this process (the layout without ``--clients``)."""

    def __init__(self, groups: int, per_channel: int) -> None:
        self._shard = Shard(0, 1, groups, per_channel)

    async def add(self, kind: str, targets: Sequence[str], streams: int) -> None:
        self._shard.add(kind, targets, streams)

    async def connect(self, kind: str, upto: int, timeout: float) -> Synced:
        return await self._shard.connect(kind, upto, timeout)

    async def begin(self, kind: str, round_: int) -> None:
        self._shard.begin(kind, round_)

    async def wait(self, kind: str, timeout: float) -> Round:
        return await self._shard.wait(kind, timeout)

    def cpu(self) -> float:
        return time.process_time()

    async def close(self) -> None:
        await self._shard.close()


class WorkerClients:
    """The streams spread over ``count`` worker processes (``--clients``)."""

    def __init__(self, count: int, groups: int, per_channel: int, log_dir: Path) -> None:
        self._args = (count, groups, per_channel, log_dir)
        self._stack = AsyncExitStack()
        self.workers: list[Child] = []
        self._start: dict[str, float] = {}
        self._started: dict[str, list[float]] = {}

    async def __aenter__(self) -> WorkerClients:
        count, groups, per_channel, log_dir = self._args
        async with AsyncExitStack() as stack:
            for worker in range(count):
                args = [str(worker), str(count), str(groups), str(per_channel)]
                name = f"client-{worker + 1}"
                child = Child("bench.xds_clients", args, log_dir / f"{name}.log", name)
                self.workers.append(await stack.enter_async_context(child))
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._stack.__aexit__(*exc_info)

    async def _all(self, line: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(w.command(line, timeout) for w in self.workers)))

    async def add(self, kind: str, targets: Sequence[str], streams: int) -> None:
        await self._all(f"add {kind} {streams} {','.join(targets)}")

    async def connect(self, kind: str, upto: int, timeout: float) -> Synced:
        start = time.monotonic()
        answers = await self._all(f"connect {kind} {upto} {timeout!r}", timeout + 60)
        reasons = [str(a["reason"]) for a in answers if a["reason"]]
        retries = sum(int(a["retries"]) for a in answers)
        return Synced(time.monotonic() - start, retries, reasons[0] if reasons else "")

    async def begin(self, kind: str, round_: int) -> None:
        answers = await self._all(f"begin {kind} {round_}")
        self._started[kind] = [float(a["started"]) for a in answers]
        self._start[kind] = time.monotonic()  # right before the trigger, as in one process

    async def wait(self, kind: str, timeout: float) -> Round:
        answers = await self._all(f"wait {kind} {timeout!r}", timeout + 60)
        start, latencies, responses, duplicates = self._start[kind], [], Counter[str](), 0
        for began, answer in zip(self._started[kind], answers, strict=True):
            latencies += [began + seconds - start for seconds in answer["latencies"]]
            responses.update(answer["responses"])
            duplicates += int(answer["duplicates"])
        return Round(latencies, responses, duplicates)

    def cpu(self) -> float:
        return time.process_time() + sum(w.cpu() for w in self.workers)


async def _serve(shard: Shard) -> None:
    """Answer the coordinator's commands (module docstring) until stdin closes."""
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    _answer({"ready": True})
    try:
        while line := (await commands.readline()).decode().strip():
            try:
                _answer(await _command(shard, line.split()))
            except Exception as exc:  # the coordinator raises it, with this worker's name
                _answer({"error": f"{line!r}: {exc}"})
    finally:
        await shard.close()


async def _command(shard: Shard, words: Sequence[str]) -> dict[str, Any]:
    match words:
        case ["add", kind, streams, targets]:
            shard.add(kind, targets.split(","), int(streams))
            return {}
        case ["connect", kind, upto, timeout]:
            synced = await shard.connect(kind, int(upto), float(timeout))
            return {"retries": synced.retries, "reason": synced.reason}
        case ["begin", kind, round_]:
            return {"started": shard.begin(kind, int(round_))}
        case ["wait", kind, timeout]:
            found = await shard.wait(kind, float(timeout))
            return {
                "latencies": found.latencies,
                "responses": dict(found.responses),
                "duplicates": found.duplicates,
            }
    raise ValueError("unknown command")


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        raise SystemExit("usage: python -m bench.xds_clients WORKER WORKERS GROUPS PER_CHANNEL")
    worker, workers, groups, per_channel = (int(arg) for arg in argv)
    xds_server.raise_open_files(65536)
    asyncio.run(_serve(Shard(worker, workers, groups, per_channel)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
