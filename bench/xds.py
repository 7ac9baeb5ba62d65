"""proxy-cp's push to many ADS streams, against a bare grpcio server pushing the same bytes.

The requirement: N simulated ADS streams (1,000 and 5,000) on one proxy-cp process; after
one change that touches all of them, the time until every stream has ACKed (median, p99),
CPU seconds and memory per stream; beside it, in the same run, a bare grpcio server pushing
the same pre-serialized bytes to the same streams (the floor); both, and the ratio.

For each N, two server processes (:mod:`bench.xds_server`): ``trellis`` (proxy-cp's cache,
core, hooks and ADS servicer) and ``floor`` (a bare servicer writing pre-serialized bytes).
This process is the client (:mod:`bench.xds_client`): N Envoy-like SotW streams to each
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
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

from bench import load, report, xds_client, xds_server
from bench.xds_procs import Replicas, Server, ServerProcess
from trellis_proxy_cp.types import ENDPOINT

SIZES = (1_000, 5_000)
QUICK_SIZES = (200, 1_000)
QUICK_SECONDS = 1.0
GROUPS = 10
PER_CHANNEL = 50
ROUNDS = report.ROUNDS
KINDS = ("trellis", "replicas", "floor")
SUBJECTS = ("trellis", "replicas")  # each measured against the floor
REPLICAS = 2
SYNC_TIMEOUT = 600.0
PUSH_TIMEOUT = 120.0


def sizes(seconds: float, env: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    text = env.get("TRELLIS_BENCH_XDS_STREAMS", "").strip()
    if text:
        chosen = tuple(int(part) for part in text.split(","))
        if any(n < GROUPS * 2 for n in chosen):
            raise ValueError(f"TRELLIS_BENCH_XDS_STREAMS: each N must be >= {GROUPS * 2}")
        return chosen
    return SIZES if seconds >= QUICK_SECONDS else QUICK_SIZES


def _per_channel(env: Mapping[str, str] = os.environ) -> int:
    text = env.get("TRELLIS_BENCH_XDS_PER_CHANNEL", "").strip()
    return int(text) if text else PER_CHANNEL


def _replicas(env: Mapping[str, str] = os.environ) -> int:
    text = env.get("TRELLIS_BENCH_XDS_REPLICAS", "").strip()
    count = int(text) if text else REPLICAS
    if count < 1:
        raise ValueError(f"TRELLIS_BENCH_XDS_REPLICAS must be >= 1, got {count}")
    return count


def _server(kind: str, log_dir: Path) -> AbstractAsyncContextManager[Server]:
    if kind == "replicas":
        return Replicas(_replicas(), GROUPS, log_dir)
    return ServerProcess(kind, GROUPS, log_dir)


@dataclass
class Side:
    """What one server measured at one N."""

    sync_s: float = 0.0
    sync_cpu: float = 0.0
    retries: int = 0
    retry_reason: str = ""
    list_proxies: int = 0
    rss_per_stream: float = 0.0
    latencies: list[float] = field(default_factory=list)
    all_acked: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    set_s: list[float] = field(default_factory=list)
    gc_s: list[float] = field(default_factory=list)
    gc_full: int = 0
    stall_s: list[float] = field(default_factory=list)  # the loop's worst stall per change


def run(*, seconds: float = 2.0, warmup: float = 0.2) -> dict[str, float]:
    xds_server.raise_open_files(65536)
    per_channel = _per_channel()
    profile = os.environ.get("TRELLIS_BENCH_XDS_PROFILE", "").strip()
    started = time.perf_counter()
    results: dict[str, float] = {}
    for n in sizes(seconds):
        measured = asyncio.run(_measure(n, per_channel, warmup > 0, profile))
        results |= _report(n, per_channel, measured)
        if profile:
            print(f"  (cProfiles of the servers: {profile}/{{trellis,floor}}-{n}.prof)\n")
    print(f"  (the whole run took {time.perf_counter() - started:.1f} s, start-up included)")
    return results


async def _measure(n: int, per_channel: int, warm: bool, profile: str) -> dict[str, Side]:
    sides = {kind: Side() for kind in KINDS}
    async with AsyncExitStack() as stack:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="trellis-xds-")))
        servers: dict[str, Server] = {}
        fleets = {}
        for kind in KINDS:
            server = await stack.enter_async_context(_server(kind, log_dir))
            fleet = xds_client.Fleet(f"127.0.0.1:{server.port}", n, GROUPS, per_channel)
            stack.push_async_callback(fleet.close)
            await fleet.connect(GROUPS, SYNC_TIMEOUT)  # one per group: the snapshots exist
            listed = (await server.until("streams", GROUPS))["list_proxies"]
            await server.command(f"expect {n}")  # onboarded now: proxy-cp knows none of them
            rss, cpu = server.rss(), server.cpu()
            sides[kind].sync_s = await fleet.connect(n - GROUPS, SYNC_TIMEOUT)
            stats = await server.until("streams", n)
            sides[kind].sync_cpu = server.cpu() - cpu
            sides[kind].list_proxies = int(stats["list_proxies"]) - int(listed)
            sides[kind].retries = fleet.retries
            sides[kind].retry_reason = str(fleet.retry_reason or "")[:160]
            sides[kind].rss_per_stream = (server.rss() - rss) / (n - GROUPS)
            servers[kind], fleets[kind] = server, fleet
        change = 0
        for round_ in range(-1 if warm else 0, ROUNDS):
            for kind in KINDS:
                change += 1
                side = sides[kind] if round_ >= 0 else Side()
                path = f"{profile}/{kind}-{n}.prof" if profile else ""
                await _push(servers[kind], fleets[kind], change, side, path if round_ >= 0 else "")
    return sides


async def _push(
    server: Server, fleet: xds_client.Fleet, change: int, side: Side, profile: str
) -> None:
    """One change on ``server``; add its figures to ``side``."""
    await server.command(f"prepare {change}")
    if profile:
        await server.command("profile start")
    cpu, client_cpu = server.cpu(), time.process_time()
    fleet.begin(change)
    answer = await server.command(f"push {change}")
    latencies = await fleet.wait(PUSH_TIMEOUT)
    stats = await server.until("acks", fleet.size)
    side.cpu.append(server.cpu() - cpu)
    side.gc_s.append(float(stats["gc_s"]))
    side.gc_full += int(stats["gc_full"])
    side.stall_s.append(float(stats["lag_max_s"]))
    side.client_cpu.append(time.process_time() - client_cpu)
    if profile:
        await server.command(f"profile stop {profile}")
    if fleet.duplicates or set(fleet.responses) != {ENDPOINT}:
        raise RuntimeError(
            f"{server.kind}: a change should send exactly one EDS response per stream, got "
            f"{dict(fleet.responses)} ({fleet.duplicates} repeated EDS responses)"
        )
    side.latencies += latencies
    side.all_acked.append(max(latencies))
    side.set_s.append(float(answer["set_s"]))


def _report(n: int, per_channel: int, sides: dict[str, Side]) -> dict[str, float]:
    ms = 1000.0
    rounds = len(sides["trellis"].all_acked)
    figures: dict[str, dict[str, report.Figure]] = {}
    replicas = _replicas()
    names = {"trellis": "proxy-cp", "replicas": f"{replicas} proxy-cp replicas", "floor": "floor"}
    for kind, side in sides.items():
        what = names[kind]
        cpu = statistics.mean(side.cpu)
        figures[kind] = {
            "p50": report.Figure(
                f"{kind}_p50_ms",
                load.percentile(side.latencies, 0.5) * ms,
                "ms",
                f"{what}: change -> a stream's EDS ACK written, median of {len(side.latencies):,}",
            ),
            "p99": report.Figure(
                f"{kind}_p99_ms", load.percentile(side.latencies, 0.99) * ms, "ms", "the same, p99"
            ),
            "all": report.Figure(
                f"{kind}_all_ms",
                statistics.median(side.all_acked) * ms,
                "ms",
                f"change -> the last stream's ACK, median of {rounds} rounds "
                f"(min {min(side.all_acked) * ms:,.0f}, max {max(side.all_acked) * ms:,.0f})",
            ),
            "cpu": report.Figure(
                f"{kind}_cpu_ms",
                cpu * ms,
                "ms",
                f"server CPU per change, mean: {cpu / n * 1e6:,.0f} us per stream; in GC "
                f"{statistics.mean(side.gc_s) * ms:,.0f} ms ({side.gc_full} full collections "
                f"in {rounds} changes); client CPU {statistics.mean(side.client_cpu) * ms:,.0f} ms",
            ),
            "stall": report.Figure(
                f"{kind}_loop_stall_ms",
                max(side.stall_s) * ms,
                "ms",
                f"the server's event loop held, worst over the {rounds} changes (its lag probe"
                + ("; the slowest replica's)" if kind == "replicas" else ")"),
            ),
            "rss": report.Figure(
                f"{kind}_rss_per_stream_kb",
                side.rss_per_stream / 1024,
                "kB",
                f"server RSS growth over {n - GROUPS:,} streams, per stream",
            ),
            "sync": report.Figure(
                f"{kind}_sync_s",
                side.sync_s,
                "s",
                f"{n - GROUPS:,} new streams at once until all synced (CDS..SDS ACKed); "
                f"server CPU {side.sync_cpu:.2f} s; {side.retries:,} refused and retried"
                + (f"; {side.list_proxies:,} ListProxies calls" if kind != "floor" else "")
                + (f"; the first refusal: {side.retry_reason}" if side.retries else ""),
            ),
        }
    floor = figures["floor"]
    ordered: list[report.Figure] = []
    for kind in SUBJECTS:
        set_ms = statistics.median(sides[kind].set_s) * ms
        ordered += [figures[kind][k] for k in ("p50", "p99", "all")]
        ordered.append(
            report.Figure(
                f"{kind}_set_ms",
                set_ms,
                "ms",
                f"set_view for the {GROUPS} groups (translate, serialize, set), median"
                + (" (the slowest replica's)" if kind == "replicas" else ""),
            )
        )
        ordered += [figures[kind][k] for k in ("stall", "cpu", "rss", "sync")]
        ordered.append(
            report.Figure(
                f"{kind}_sync_refused",
                sides[kind].retries,
                "streams",
                "refused by the server while they synced, and retried after a backoff",
            )
        )
        ordered.append(
            report.Figure(
                f"{kind}_sync_list_proxies",
                sides[kind].list_proxies,
                "calls",
                f"catalog ListProxies calls to authorize the {n - GROUPS:,} new streams",
            )
        )
    ordered += [floor[k] for k in ("p50", "p99", "all", "stall", "cpu", "rss", "sync")]
    report.print_table(
        f"xds N={n:,}: SotW ADS streams over {-(-n // per_channel)} connections "
        f"({per_channel} per connection), {GROUPS} groups of {n // GROUPS:,}; one EDS change "
        f"touching every group, {rounds} rounds; servers in their own processes "
        f"(replicas: {replicas} on one port; CPU and RSS summed over them)",
        ordered,
    )
    ratios = {
        f"{figures[kind][k].name}/{floor[k].name}@{n}": report.ratio_line(
            figures[kind][k], floor[k]
        )
        for kind in SUBJECTS
        for k in ("p50", "p99", "all", "cpu", "rss", "sync")
    }
    print()
    return {f"{f.name}@{n}": f.value for f in ordered} | ratios
