"""The load the endpoints benchmark drives, and the consumer that times what it sees.

Kept apart from :mod:`bench.endpoints` (which wires processes and prints the report): the
registration bodies, running an operation over many indices with a few in flight, the
consumer on the one event path (a :class:`~trellis_runtime.events.Follower` on a real
:class:`~trellis_runtime.events.Signals` hub that fetches ``GetService`` on each
``endpoints`` signal) that notes when each address first appears, and the small checks
and statistics around them.
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
from trellis_runtime.events import Follower, Signals
from trellis_runtime.health import Health
from trellis_runtime.signaling import Event

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


class FetchingFollower(Follower):
    """A consumer of one provider's ``endpoints`` signals: fetch what each one names.

    On a signal for a service of ``namespace`` it calls ``GetService`` (NOT_FOUND: the
    service is gone) and notes, for each address in the answer, when it first appeared
    (after the fetch returned: what a consumer can act on). A resync lists the namespace.
    :meth:`expect` names the addresses of the next batch; :attr:`complete` is set once
    every one of them was seen.
    """

    topics = (TOPIC,)

    def __init__(self, stub: pb_grpc.EndpointsProviderAsyncStub, namespace: str) -> None:
        super().__init__(f"bench consumer of {namespace}")
        self._stub = stub
        self._namespace = namespace
        self.first_seen: dict[str, float] = {}
        self.missing: set[str] = set()
        self.complete = asyncio.Event()
        self.signals = 0
        self.resyncs = 0

    async def resync(self, topic: str) -> None:
        listing = await self._stub.ListServices(
            pb.ListServicesRequest(namespace=self._namespace), timeout=60
        )
        self.resyncs += 1
        for service in listing.services:
            self._saw(service.endpoints)

    async def changed_all(self, events: Sequence[Event]) -> None:
        """As the catalog's provider follower does: once per service, concurrently."""
        latest = {event.key: event for event in events}
        results = await asyncio.gather(*map(self.changed, latest.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def changed(self, event: Event) -> None:
        namespace, _, name = event.key.partition("/")
        if namespace != self._namespace:
            return
        self.signals += 1
        request = pb.GetServiceRequest(service=pb.ServiceRef(namespace=namespace, name=name))
        try:
            service = await self._stub.GetService(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return  # removed since the signal
        self._saw(service.endpoints)

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


class Consumer:
    """A :class:`FetchingFollower` on its own :class:`Signals` hub (one Redis subscription)."""

    def __init__(self, follower: FetchingFollower, hub: Signals) -> None:
        self.follower = follower
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(hub.run(self._stop))

    @classmethod
    async def start(
        cls, stub: pb_grpc.EndpointsProviderAsyncStub, redis_url: str, namespace: str
    ) -> Consumer:
        """Subscribe, and return once the first resync is done."""
        follower = FetchingFollower(stub, namespace)
        hub = Signals(redis_url, Health())
        hub.follow(follower)
        consumer = cls(follower, hub)
        synced = asyncio.create_task(follower.synced.wait())
        await asyncio.wait(
            {synced, consumer._task}, timeout=30, return_when=asyncio.FIRST_COMPLETED
        )
        if not follower.synced.is_set():
            synced.cancel()
            await consumer.close()
            raise RuntimeError("the signals hub did not subscribe and resync within 30 s")
        return consumer

    @property
    def first_seen(self) -> dict[str, float]:
        return self.follower.first_seen

    def expect(self, addresses: Iterable[str]) -> None:
        self.follower.expect(addresses)

    async def wait(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.follower.complete.wait(), timeout)
        except TimeoutError:
            missing = self.follower.missing
            raise RuntimeError(
                f"{len(missing)} registrations never showed in a GetService after their "
                f"signal within {timeout:g} s, e.g. {sorted(missing)[:3]}"
            ) from None
        if self._task.done():
            raise RuntimeError(f"the signals hub ended: {self._task!r}")

    @property
    def resyncs(self) -> int:
        """Resyncs after the first (a gap, a reconnect, a failed fetch): each a listing."""
        return self.follower.resyncs - 1

    async def close(self) -> None:
        self._stop.set()
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
