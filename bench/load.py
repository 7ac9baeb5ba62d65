"""The load the endpoints benchmark drives, and the consumer that times what it sees.

Kept apart from :mod:`bench.endpoints` (which wires processes and prints the report): the
registration bodies, running an operation over many indices with a few in flight, the
consumer that watches the provider as the catalog does (``WatchServices``) and notes when
each address first appears, and the small checks and statistics around them.
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

from bench import rest
from trellis_api import endpoints_pb2 as pb
from trellis_api import endpoints_pb2_grpc as pb_grpc

IndexedOp = Callable[[int], Awaitable[None]]
TOPIC = "endpoints"  # the provider's topic; keys "<namespace>/<service>"
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


def expect_status(response: httpx.Response | rest.Response, status: int) -> None:
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


class Consumer:
    """A consumer of one provider, as the catalog follows it: one ``WatchServices`` stream.

    It notes, for each address in an answer for a service of ``namespace``, when it first
    appeared (when the answer arrived: what a consumer can act on). A stream that ends or
    fails is opened again, from a full listing, and counted (:attr:`resyncs`).
    :meth:`expect` names the addresses of the next batch; :attr:`complete` is set once every
    one of them was seen.
    """

    def __init__(self, stub: pb_grpc.EndpointsProviderAsyncStub, namespace: str) -> None:
        self._stub = stub
        self._namespace = namespace
        self.first_seen: dict[str, float] = {}
        self.missing: set[str] = set()
        self.complete = asyncio.Event()
        self.synced = asyncio.Event()
        self.answers = 0
        self.listings = 0
        self._task = asyncio.create_task(self._watch())

    @classmethod
    async def start(cls, stub: pb_grpc.EndpointsProviderAsyncStub, namespace: str) -> Consumer:
        """Watch, and return once the first (full) answer is in."""
        consumer = cls(stub, namespace)
        synced = asyncio.create_task(consumer.synced.wait())
        await asyncio.wait(
            {synced, consumer._task}, timeout=30, return_when=asyncio.FIRST_COMPLETED
        )
        if not consumer.synced.is_set():
            synced.cancel()
            await consumer.close()
            raise RuntimeError("the watch did not answer within 30 s")
        return consumer

    async def _watch(self) -> None:
        request = pb.ListServicesRequest(namespace=self._namespace)
        while True:
            call = self._stub.WatchServices(request)
            try:
                async for answer in call:
                    self.answers += 1
                    self.listings += answer.full
                    for service in answer.services:
                        self._saw(service.endpoints)
                    self.synced.set()
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.1)  # the provider went away: watch again, listed in full
            finally:
                call.cancel()

    def _saw(self, endpoints: Iterable[pb.Endpoint]) -> None:
        now = time.perf_counter()
        for endpoint in endpoints:
            if endpoint.address not in self.first_seen:
                self.first_seen[endpoint.address] = now
                self.missing.discard(endpoint.address)
        if not self.missing:
            self.complete.set()

    def expect(self, addresses: Iterable[str]) -> None:
        self.missing = {a for a in addresses if a not in self.first_seen}
        if self.missing:
            self.complete.clear()
        else:
            self.complete.set()

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.complete.wait(), timeout)
        except TimeoutError:
            missing = self.missing
            raise RuntimeError(
                f"{len(missing)} registrations never showed on the watch within "
                f"{timeout:g} s, e.g. {sorted(missing)[:3]}"
            ) from None
        if self._task.done():
            raise RuntimeError(f"the watch ended: {self._task!r}")

    @property
    def resyncs(self) -> int:
        """Listings after the first (a watch opened again): each lists every service."""
        return self.listings - 1

    async def close(self) -> None:
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
