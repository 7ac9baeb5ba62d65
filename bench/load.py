"""The load the endpoints benchmark drives, and the watcher that times its events.

Kept apart from :mod:`bench.endpoints` (which wires processes and prints the report): the
registration bodies, running an operation over many indices with a few in flight, the
Watch consumer that notes when each address first appears, and the small checks and
statistics around them.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import grpc
import httpx

from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc

IndexedOp = Callable[[int], Awaitable[None]]
WatchCall = grpc.aio.UnaryStreamCall[pb.WatchRequest, pb.EndpointsEvent]
WARMUP_NAMESPACE = "bench-warmup"
WARMUP_SERVICES = 10


def fail_fast_sniffio_import() -> None:
    """Make ``import sniffio`` fail at once when it is not installed.

    httpcore 1.0 imports ``sniffio`` inside ``current_async_library()``, several times per
    request, and anyio >= 4.11 no longer pulls it in. A failed import is not cached, so
    each one searches every ``sys.path`` entry again: about 3 ms of this process's CPU per
    request here (encode/httpcore discussion #1102). ``None`` in ``sys.modules`` makes the
    import raise ``ImportError`` straight away, which httpcore takes as "asyncio".
    """
    if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
        sys.modules["sniffio"] = None  # type: ignore[assignment]


def address(i: int, network: int = 10) -> str:
    """A unique IPv4 address per index (up to 2**24 of them) in ``network``.0.0.0/8."""
    return f"{network}.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"


def registration(namespace: str, i: int, services: int, network: int = 10) -> dict[str, Any]:
    """The body of ``POST /v1/workloads`` for workload ``i``."""
    return {
        "namespace": namespace,
        "name": f"w-{i}",
        "services": [f"svc-{i % services}"],
        "address": address(i, network),
        "ports": [{"name": "http", "number": 8080}],
    }


def expect_status(response: httpx.Response, status: int) -> None:
    if response.status_code != status:
        raise RuntimeError(
            f"{response.request.method} {response.request.url} answered "
            f"{response.status_code}, not {status}: {response.text[:500]}"
        )


async def in_flight(op: IndexedOp, indices: Iterable[int], concurrency: int) -> float:
    """Run ``op`` once per index, ``concurrency`` at a time; return the wall time."""
    pending = iter(indices)

    async def worker() -> None:
        for i in pending:  # the workers share one iterator: each index runs once
            await op(i)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return time.perf_counter() - start


async def for_seconds(op: IndexedOp, concurrency: int, seconds: float) -> int:
    """Run ``op`` on indices 0, 1, ... for about ``seconds``; return how many ran."""
    if seconds <= 0:
        return 0
    deadline = time.perf_counter() + seconds
    counter = itertools.count()
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await op(next(counter))
            done += 1

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())
    return done


async def warm_up(client: httpx.AsyncClient, concurrency: int, seconds: float) -> None:
    """Register in :data:`WARMUP_NAMESPACE` for ``seconds``, then deregister them all."""

    async def register(i: int) -> None:
        body = registration(WARMUP_NAMESPACE, i, WARMUP_SERVICES, network=172)
        expect_status(await client.post("/v1/workloads", json=body), 201)

    async def deregister(i: int) -> None:
        expect_status(await client.delete(f"/v1/workloads/{WARMUP_NAMESPACE}/w-{i}"), 204)

    count = await for_seconds(register, concurrency, seconds)
    await in_flight(deregister, range(count), concurrency)


class Watcher:
    """One ``Watch`` stream: when did an event of ``namespace`` first list each address.

    :meth:`expect` names the addresses of the next batch; :meth:`wait` returns once every
    one of them was seen, and raises if the stream ended or the time ran out.
    """

    def __init__(self, call: WatchCall, namespace: str) -> None:
        self._call = call
        self._namespace = namespace
        self.first_seen: dict[str, float] = {}
        self._missing: set[str] = set()
        self._complete = asyncio.Event()
        self._failure: BaseException | None = None
        self._task = asyncio.create_task(self._run())

    @classmethod
    async def start(cls, stub: pb_grpc.EndpointsProviderAsyncStub, namespace: str) -> Watcher:
        call = stub.Watch(pb.WatchRequest())
        first = await call.read()
        if not isinstance(first, pb.EndpointsEvent) or first.kind != pb.EndpointsEvent.SNAPSHOT:
            call.cancel()
            raise RuntimeError(f"Watch did not start with a SNAPSHOT: {first!r}")
        return cls(call, namespace)

    async def _run(self) -> None:
        clock = time.perf_counter
        try:
            while True:
                event = await self._call.read()
                if not isinstance(event, pb.EndpointsEvent):
                    raise RuntimeError("the Watch stream ended")
                if (
                    event.kind != pb.EndpointsEvent.CHANGED
                    or event.service.namespace != self._namespace
                ):
                    continue
                now = clock()
                for endpoint in event.state.endpoints:
                    if endpoint.address not in self.first_seen:
                        self.first_seen[endpoint.address] = now
                        self._missing.discard(endpoint.address)
                if not self._missing:
                    self._complete.set()
        except BaseException as exc:
            self._failure = exc
            self._complete.set()
            raise

    def expect(self, addresses: Iterable[str]) -> None:
        self._missing = {a for a in addresses if a not in self.first_seen}
        if self._missing:
            self._complete.clear()
        else:
            self._complete.set()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self._complete.wait(), timeout)
        except TimeoutError:
            raise RuntimeError(
                f"{len(self._missing)} registrations never showed in a watch event "
                f"within {timeout:g} s, e.g. {sorted(self._missing)[:3]}"
            ) from None
        if self._failure is not None:
            raise RuntimeError(f"the Watch stream failed: {self._failure!r}")

    async def close(self) -> None:
        self._call.cancel()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def check_listing(services: Sequence[dict[str, Any]], workloads: int, count: int) -> None:
    """A listing must hold ``count`` services and ``workloads`` endpoints in all."""
    endpoints = sum(len(s["endpoints"]) for s in services)
    if len(services) != count or endpoints != workloads:
        raise RuntimeError(
            f"listed {len(services)} services and {endpoints} endpoints, expected "
            f"{count} and {workloads}"
        )


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process from ``/proc``; ``None`` where there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; state is [0]
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile (0.5: median, 0.99: p99)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
