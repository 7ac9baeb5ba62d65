"""The Linkerd Destination API's fan-out: N open ``Get`` streams, one endpoint change, and
the time until every stream has it.

The server runs in a process of its own (``python -m bench.destination serve KIND``): either
proxy-cp's real servicer over a :class:`DestinationTable` (``trellis``), or the floor
(``floor``): a bare grpcio server-streaming servicer whose streams wait on one shared event
and write one prebuilt ``Update`` when it fires, with no table, no diff and no queue. Both
use the same messages and an insecure port (TLS would cost both alike). This process opens
the streams over a few channels, reads each stream's first message, then, round after
round, tells the server to make one change and times every stream's receipt of it.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from functools import partial
from typing import Any

import grpc

from bench.report import Figure, print_table, ratio_line, results
from trellis_api import catalog_pb2 as cpb
from trellis_api.linkerd import destination_pb2 as dpb
from trellis_api.linkerd import destination_pb2_grpc as dpb_grpc

STREAMS = 1000
CHANNELS = 10
PATH = "web.shop.svc.cluster.local:80"


def _destination(version: int) -> cpb.Destination:
    endpoints = [cpb.ClusterEndpoint(address="10.0.0.1", port=p) for p in range(1, 4 + version)]
    cluster = cpb.Cluster(name="shop/web|80", port=80, protocol="http", endpoints=endpoints)
    return cpb.Destination(
        namespace="shop", name="web", version=str(version), ports=[cluster], trust_domain="td"
    )


class Floor(dpb_grpc.DestinationServicer):
    """Every stream writes one prebuilt update when the shared event fires."""

    def __init__(self) -> None:
        self.changed = asyncio.Condition()
        self.generation = 0
        self.update = dpb.Update(add=dpb.WeightedAddrSet(addrs=[dpb.WeightedAddr(weight=1)]))

    async def Get(self, request: dpb.GetDestination, context: Any) -> None:  # type: ignore[override]
        await context.write(self.update)
        seen = self.generation
        while True:
            async with self.changed:
                await self.changed.wait_for(partial(self._moved_since, seen))
            seen = self.generation
            await context.write(self.update)

    async def GetProfile(self, request: dpb.GetDestination, context: Any) -> None:  # type: ignore[override]
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the floor serves Get only")

    def _moved_since(self, seen: int) -> bool:
        return self.generation != seen

    async def change(self, version: int) -> None:
        async with self.changed:
            self.generation = version
            self.changed.notify_all()


async def serve(kind: str) -> None:
    """The server process: prints its port, then makes one change per line on stdin."""
    from prometheus_client import CollectorRegistry

    from trellis_proxy_cp.clients.destinations import DestinationTable
    from trellis_proxy_cp.discovery import testing as fake
    from trellis_proxy_cp.discovery.server import (
        LINKERD_SERVICE,
        Discovery,
        DiscoveryMetrics,
        DiscoveryOptions,
        LinkerdDestination,
    )
    from trellis_runtime.grpcserver import GrpcServer
    from trellis_runtime.metrics import MetricFactory

    table = DestinationTable()
    table.apply([_destination(0)], [])
    floor = Floor()
    servicer: dpb_grpc.DestinationServicer = floor
    if kind == "trellis":
        metrics = DiscoveryMetrics(MetricFactory(CollectorRegistry(), "bench"))
        # the client's identity may reach shop/web (the access check is part of the path)
        access = fake.access(fake.CatalogViews({fake.CALLER.identity: fake.view("shop/web")}))
        servicer = LinkerdDestination(Discovery(table, DiscoveryOptions(), metrics, access))
    server = GrpcServer(
        "127.0.0.1:0",
        [lambda s: dpb_grpc.add_DestinationServicer_to_server(servicer, s)],
        [LINKERD_SERVICE],
        grace=0.1,
    )
    port = await server.start()
    print(port, flush=True)
    loop = asyncio.get_running_loop()
    version = 0
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        version += 1
        if kind == "trellis":
            table.apply([_destination(version)], [])
        else:
            await floor.change(version)


async def _fan_out(port: int, server: subprocess.Popen[str], rounds: int) -> list[list[float]]:
    """Per round, every stream's delay (s) from the change's request to its receipt."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}") for _ in range(CHANNELS)]
    request = dpb.GetDestination(path=PATH)
    calls = [dpb_grpc.DestinationStub(channels[i % CHANNELS]).Get(request) for i in range(STREAMS)]
    try:
        await asyncio.gather(*(c.read() for c in calls))
        delays = []
        for _ in range(rounds):
            received: list[float] = []
            readers = [asyncio.create_task(_receipt(c, received)) for c in calls]
            await asyncio.sleep(0.05)  # every reader is waiting
            started = time.perf_counter()
            assert server.stdin is not None
            server.stdin.write("change\n")
            server.stdin.flush()
            await asyncio.wait_for(asyncio.gather(*readers), 60)
            delays.append([t - started for t in received])
        return delays
    finally:
        for call in calls:
            call.cancel()
        for channel in channels:
            await channel.close()


async def _receipt(call: Any, received: list[float]) -> None:
    await call.read()
    received.append(time.perf_counter())


def _measure(kind: str, rounds: int) -> list[list[float]]:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.destination", "serve", kind],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        return asyncio.run(_fan_out(port, server, rounds))
    finally:
        server.kill()
        server.wait()


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run(*, seconds: float, warmup: float) -> dict[str, float]:
    rounds = max(3, int(seconds * 5))
    figures = []
    for kind in ("floor", "trellis"):
        delays = _measure(kind, rounds)
        every = [d for r in delays for d in r]
        all_have = [max(r) for r in delays]
        figures += [
            Figure(f"{kind}_stream_p50", statistics.median(every) * 1000, "ms", "one stream"),
            Figure(f"{kind}_stream_p99", _p99(every) * 1000, "ms", "one stream"),
            Figure(
                f"{kind}_all_p50",
                statistics.median(all_have) * 1000,
                "ms",
                f"until all {STREAMS} streams have it, median of {rounds} changes",
            ),
            Figure(f"{kind}_all_p99", _p99(all_have) * 1000, "ms", "same, worst-ish"),
        ]
    print_table(f"Destination API: {STREAMS} Get streams, one endpoint change", figures)
    by = {f.name: f for f in figures}
    ratios = {
        f"{name}_vs_floor": ratio_line(by[f"trellis_{name}"], by[f"floor_{name}"])
        for name in ("stream_p50", "stream_p99", "all_p50", "all_p99")
    }
    return results(figures, ratios)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        asyncio.run(serve(sys.argv[2]))
    else:
        run(seconds=2.0, warmup=0.2)
