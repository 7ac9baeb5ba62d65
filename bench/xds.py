"""proxy-cp's push to many ADS streams, against a bare grpcio server pushing the same bytes.

The requirement: N simulated ADS streams (1,000 and 5,000) on one proxy-cp process; after
one change that touches all of them, the time until every stream has ACKed (median, p99),
CPU seconds and memory per stream; beside it, in the same run, a bare grpcio server pushing
the same pre-serialized bytes to the same streams (the floor); both, and the ratio.

For each N, server processes (:mod:`bench.xds_server`): ``trellis`` (proxy-cp's cache,
core, hooks and ADS servicer), ``floor`` (a bare servicer writing pre-serialized bytes) and
proxy-cp replicas (Layout, below). This process is the client (:mod:`bench.xds_client`;
or C workers, below): N Envoy-like SotW streams to each
server, :data:`PER_CHANNEL` per connection. Stream ``i`` is a proxy of group ``i % 10``
(:data:`GROUPS` identities with N/10 proxies each, one snapshot per group, see
:mod:`bench.xds_mesh`): one stream per group connects first (so the groups' snapshots
exist), then the other N - 10 at once (``sync_s``: until every one has ACKed CDS, EDS,
LDS, RDS and SDS). The servers' RSS before and after those N - 10 streams gives the
memory per stream.

Then :data:`ROUNDS` rounds, each one change per server, taking turns (trellis, floor,
trellis, ...), after ``--warmup`` > 0 one unmeasured change each. A change moves one
endpoint of the service every group calls: proxy-cp gets a new view for each of the 10
identities (``set_view``: translate, serialize, check, set the snapshot; ``set_ms``), the
floor puts the pre-serialized EDS response of the group on each stream's queue. The clock
starts right before the trigger is written to the server's stdin and stops, per stream,
when the client has received the EDS response and written its ACK. The round ends when
every stream has, and the server counted every ACK; the server's CPU time (user + system
of all its threads, ``/proc/<pid>/stat``) over the round is the push's cost.

Figures per N: latency median and p99 over every stream of every round, ``all_ms`` (the
last stream's ACK, median over rounds), CPU per push, RSS per stream, sync time; ratios of
trellis to the floor. The client shares the machine: its own CPU per push is printed too.

Scale: ``--seconds`` >= 1 (the default 2) runs N = 1,000 and 5,000; below that N = 200 and
1,000. ``TRELLIS_BENCH_XDS_STREAMS=500,2000`` picks sizes, ``TRELLIS_BENCH_XDS_PER_CHANNEL``
streams per connection (default 50; 1 is a connection per stream, as with real Envoys).
``TRELLIS_BENCH_XDS_PROFILE=DIR`` writes a cProfile of each server's event loop thread
over the measured changes to ``DIR/trellis-<N>.prof`` and ``DIR/floor-<N>.prof`` (profiling
slows the servers down: that run's figures are not comparable to others).

Layout (:class:`Layout`, from ``python -m bench xds --streams N --clients C --replicas
1,2,4,8``): ``--streams`` picks the sizes (else as above); ``--replicas`` the proxy-cp
process counts measured beside the floor, one server each (1 is one proxy-cp, ``trellis``;
more run as replicas, :class:`bench.xds_procs.Replicas`, each on its own port, the
connections spread evenly over them); the default is one proxy-cp and
``TRELLIS_BENCH_XDS_REPLICAS`` (2) replicas, as before. ``--clients C`` runs the simulated
Envoys in C worker processes (:mod:`bench.xds_clients`) instead of this one, so that the
client is not the bottleneck of a big machine. Every server of one N is up at once, and
the rounds take turns over all of them. :mod:`bench.xds_report` prints the figures, the
ratios to the floor and to one proxy-cp, and the summary table of issue 35.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from bench import report, xds_report, xds_server
from bench.xds_clients import Clients, LocalClients, WorkerClients
from bench.xds_procs import Replicas, Server, ServerProcess
from bench.xds_report import FLOOR, Side
from trellis_proxy_cp.types import ENDPOINT

SIZES = (1_000, 5_000)
QUICK_SIZES = (200, 1_000)
QUICK_SECONDS = 1.0
GROUPS = 10
PER_CHANNEL = 50
ROUNDS = report.ROUNDS
MAX_REPLICAS = 64
MAX_CLIENTS = 256
SYNC_TIMEOUT = 600.0
PUSH_TIMEOUT = 120.0


def counts(text: str, field: str, least: int, most: int | None = None) -> tuple[int, ...]:
    """``"1,2,4"`` as sorted distinct counts, each in [least, most]; a ValueError naming
    ``field`` otherwise."""
    found: set[int] = set()
    for part in text.split(","):
        try:
            value = int(part.strip())
        except ValueError:
            raise ValueError(f"{field}: {part.strip()!r} is not a whole number") from None
        if value < least or (most is not None and value > most):
            bound = f"from {least} to {most}" if most is not None else f">= {least}"
            raise ValueError(f"{field}: each must be {bound}, got {value}")
        found.add(value)
    return tuple(sorted(found))


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the streams and servers run (see the module docstring); empty is the default."""

    streams: tuple[int, ...] = ()  # the sizes N; () by --seconds or TRELLIS_BENCH_XDS_STREAMS
    clients: int = 0  # worker processes for the streams; 0: this process
    replicas: tuple[int, ...] = ()  # proxy-cp process counts; (): 1 and the default replicas

    def __post_init__(self) -> None:
        if any(n < GROUPS * 2 for n in self.streams):
            raise ValueError(f"--streams: each N must be >= {GROUPS * 2}, got {self.streams}")
        if not 0 <= self.clients <= MAX_CLIENTS:
            raise ValueError(
                f"--clients: must be from 1 to {MAX_CLIENTS} (0: this process), got {self.clients}"
            )
        if any(not 1 <= r <= MAX_REPLICAS for r in self.replicas):
            raise ValueError(f"--replicas: each must be from 1 to {MAX_REPLICAS}")

    def sizes(self, seconds: float) -> tuple[int, ...]:
        return self.streams or sizes(seconds)

    def counts(self) -> tuple[int, ...]:
        return self.replicas or tuple(sorted({1, _replicas()}))


def sizes(seconds: float, env: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    text = env.get("TRELLIS_BENCH_XDS_STREAMS", "").strip()
    if text:
        return counts(text, "TRELLIS_BENCH_XDS_STREAMS", GROUPS * 2)
    return SIZES if seconds >= QUICK_SECONDS else QUICK_SIZES


def _per_channel(env: Mapping[str, str] = os.environ) -> int:
    text = env.get("TRELLIS_BENCH_XDS_PER_CHANNEL", "").strip()
    return counts(text, "TRELLIS_BENCH_XDS_PER_CHANNEL", 1)[0] if text else PER_CHANNEL


def _replicas(env: Mapping[str, str] = os.environ) -> int:
    text = env.get("TRELLIS_BENCH_XDS_REPLICAS", "").strip()
    if not text:
        return xds_report.DEFAULT_REPLICAS
    return counts(text, "TRELLIS_BENCH_XDS_REPLICAS", 1, MAX_REPLICAS)[0]


def _server(kind: str, count: int, log_dir: Path) -> AbstractAsyncContextManager[Server]:
    if count > 1:
        return Replicas(count, GROUPS, log_dir, kind)
    return ServerProcess("trellis" if kind != FLOOR else FLOOR, GROUPS, log_dir, label=kind)


def run(
    *, seconds: float = 2.0, warmup: float = 0.2, layout: Layout | None = None
) -> dict[str, float]:
    layout = layout or Layout()
    xds_server.raise_open_files(65536)
    per_channel = _per_channel()
    profile = os.environ.get("TRELLIS_BENCH_XDS_PROFILE", "").strip()
    kinds = {xds_report.kind_of(c, _replicas()): c for c in layout.counts()} | {FLOOR: 1}
    started = time.perf_counter()
    results: dict[str, float] = {}
    for n in layout.sizes(seconds):
        measured = asyncio.run(_measure(n, kinds, layout.clients, per_channel, warmup > 0, profile))
        results |= xds_report.report_n(n, per_channel, layout.clients, GROUPS, measured)
        if profile:
            print(f"  (cProfiles of the servers: {profile}/<server>-{n}.prof)\n")
    print(f"  (the whole run took {time.perf_counter() - started:.1f} s, start-up included)")
    return results


async def _measure(
    n: int, kinds: Mapping[str, int], workers: int, per_channel: int, warm: bool, profile: str
) -> dict[str, Side]:
    sides = {kind: Side(count=count) for kind, count in kinds.items()}
    async with AsyncExitStack() as stack:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis-xds-")))
        servers: dict[str, Server] = {}
        for kind, count in kinds.items():
            servers[kind] = await stack.enter_async_context(_server(kind, count, log_dir))
        clients: Clients  # closed before the servers stop
        if workers:
            clients = await stack.enter_async_context(
                WorkerClients(workers, GROUPS, per_channel, log_dir)
            )
        else:
            clients = local = LocalClients(GROUPS, per_channel)
            stack.push_async_callback(local.close)
        for kind, server in servers.items():
            await _sync(n, server, clients, kind, sides[kind])
        change = 0
        for round_ in range(-1 if warm else 0, ROUNDS):
            for kind, server in servers.items():
                change += 1
                side = sides[kind] if round_ >= 0 else Side()
                path = f"{profile}/{kind}-{n}.prof" if profile and round_ >= 0 else ""
                await _push(n, server, clients, kind, change, side, path)
    return sides


async def _sync(n: int, server: Server, clients: Clients, kind: str, side: Side) -> None:
    """Connect the streams of ``kind``: one per group first (so that the snapshots exist),
    then the other N - GROUPS at once."""
    await clients.add(kind, server.targets, n)
    await clients.connect(kind, GROUPS, SYNC_TIMEOUT)
    listed = (await server.until("streams", GROUPS))["list_proxies"]
    await server.command(f"expect {n}")  # onboarded now: proxy-cp knows none of them
    rss, cpu = server.rss(), server.cpu()
    synced = await clients.connect(kind, n, SYNC_TIMEOUT)
    stats = await server.until("streams", n)
    side.sync_s = synced.seconds
    side.sync_cpu = server.cpu() - cpu
    side.list_proxies = int(stats["list_proxies"]) - int(listed)
    side.retries, side.retry_reason = synced.retries, synced.reason
    side.rss_per_stream = (server.rss() - rss) / (n - GROUPS)
    side.spread = await server.spread()


async def _push(
    n: int, server: Server, clients: Clients, kind: str, change: int, side: Side, profile: str
) -> None:
    """One change on ``server``; add its figures to ``side``."""
    await server.command(f"prepare {change}")
    if profile:
        await server.command("profile start")
    cpu, client_cpu = server.cpu(), clients.cpu()
    await clients.begin(kind, change)
    answer = await server.command(f"push {change}")
    found = await clients.wait(kind, PUSH_TIMEOUT)
    stats = await server.until("acks", n)
    side.cpu.append(server.cpu() - cpu)
    side.gc_s.append(float(stats["gc_s"]))
    side.gc_full += int(stats["gc_full"])
    side.stall_s.append(float(stats["lag_max_s"]))
    side.client_cpu.append(clients.cpu() - client_cpu)
    if profile:
        await server.command(f"profile stop {profile}")
    if found.duplicates or set(found.responses) != {ENDPOINT}:
        raise RuntimeError(
            f"{kind}: a change should send exactly one EDS response per stream, got "
            f"{dict(found.responses)} ({found.duplicates} repeated EDS responses)"
        )
    side.latencies += found.latencies
    side.all_acked.append(max(found.latencies))
    side.set_s.append(float(answer["set_s"]))
