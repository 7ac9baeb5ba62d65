"""What the xDS benchmark prints for one N: every figure of every server, the ratios, and one
summary table.

A server is a *kind*: ``floor`` (the bare grpcio server, one process), ``trellis`` (one
proxy-cp) or a number of proxy-cp replicas (``replicas`` for the default count,
``replicas<k>`` for another: :func:`kind_of`). The figures keep the names they always had
(``trellis_p99_ms@5000``, ``replicas_sync_s@5000``); each subject gets its ratios to the
floor and, with more than one replica, to one proxy-cp (``replicas4_p99_ms/trellis_p99_ms``).

The summary (:func:`print_summary`) is the table of issue 35: a row for the floor and a
row per replica count; p50, p99, server CPU per change, time until every new stream is
synced and RSS per stream, each with its ratio to the floor and to one proxy-cp.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from bench import load, report

FLOOR = "floor"
ONE = "trellis"  # one proxy-cp
DEFAULT_REPLICAS = 2
MS = 1000.0


def kind_of(count: int, default: int = DEFAULT_REPLICAS) -> str:
    """The figure prefix of ``count`` proxy-cp processes."""
    if count == 1:
        return ONE
    return "replicas" if count == default else f"replicas{count}"


@dataclass
class Side:
    """What one server measured at one N."""

    count: int = 1  # server processes
    sync_s: float = 0.0
    sync_cpu: float = 0.0
    retries: int = 0
    retry_reason: str = ""
    list_proxies: int = 0
    rss_per_stream: float = 0.0
    spread: list[int] = field(default_factory=list)  # streams per process, once synced
    latencies: list[float] = field(default_factory=list)
    all_acked: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    client_cpu: list[float] = field(default_factory=list)
    set_s: list[float] = field(default_factory=list)
    gc_s: list[float] = field(default_factory=list)
    gc_full: int = 0
    stall_s: list[float] = field(default_factory=list)  # the loop's worst stall per change

    @property
    def name(self) -> str:
        return "proxy-cp" if self.count == 1 else f"{self.count} proxy-cp replicas"


def _figures(kind: str, side: Side, n: int, groups: int) -> dict[str, report.Figure]:
    rounds = len(side.all_acked)
    cpu = statistics.mean(side.cpu)
    slowest = "; the slowest replica's" if side.count > 1 else ""
    what = "floor" if kind == FLOOR else side.name
    spread = f"; streams per process {min(side.spread):,}-{max(side.spread):,}"
    return {
        "p50": report.Figure(
            f"{kind}_p50_ms",
            load.percentile(side.latencies, 0.5) * MS,
            "ms",
            f"{what}: change -> a stream's EDS ACK written, median of {len(side.latencies):,}",
        ),
        "p99": report.Figure(
            f"{kind}_p99_ms", load.percentile(side.latencies, 0.99) * MS, "ms", "the same, p99"
        ),
        "all": report.Figure(
            f"{kind}_all_ms",
            statistics.median(side.all_acked) * MS,
            "ms",
            f"change -> the last stream's ACK, median of {rounds} rounds "
            f"(min {min(side.all_acked) * MS:,.0f}, max {max(side.all_acked) * MS:,.0f})",
        ),
        "set": report.Figure(
            f"{kind}_set_ms",
            statistics.median(side.set_s) * MS,
            "ms",
            f"set_view for the {groups} groups (translate, serialize, set), median"
            + (" (the slowest replica's)" if side.count > 1 else ""),
        ),
        "stall": report.Figure(
            f"{kind}_loop_stall_ms",
            max(side.stall_s) * MS,
            "ms",
            f"the server's event loop held, worst over the {rounds} changes (its lag probe"
            f"{slowest})",
        ),
        "cpu": report.Figure(
            f"{kind}_cpu_ms",
            cpu * MS,
            "ms",
            f"server CPU per change, mean, summed over {side.count} process(es): "
            f"{cpu / n * 1e6:,.0f} us per stream; in GC "
            f"{statistics.mean(side.gc_s) * MS:,.0f} ms ({side.gc_full} full collections "
            f"in {rounds} changes); client CPU {statistics.mean(side.client_cpu) * MS:,.0f} ms",
        ),
        "rss": report.Figure(
            f"{kind}_rss_per_stream_kb",
            side.rss_per_stream / 1024,
            "kB",
            f"server RSS growth over {n - groups:,} streams, per stream",
        ),
        "sync": report.Figure(
            f"{kind}_sync_s",
            side.sync_s,
            "s",
            f"{n - groups:,} new streams at once until all synced (CDS..SDS ACKed); "
            f"server CPU {side.sync_cpu:.2f} s; {side.retries:,} refused and retried"
            + (f"; {side.list_proxies:,} ListProxies calls" if kind != FLOOR else "")
            + (spread if side.count > 1 else "")
            + (f"; the first refusal: {side.retry_reason}" if side.retries else ""),
        ),
        "refused": report.Figure(
            f"{kind}_sync_refused",
            side.retries,
            "streams",
            "refused by the server while they synced, and retried after a backoff",
        ),
        "listed": report.Figure(
            f"{kind}_sync_list_proxies",
            side.list_proxies,
            "calls",
            f"catalog ListProxies calls to authorize the {n - groups:,} new streams",
        ),
    }


SUBJECT_FIGURES = ("p50", "p99", "all", "set", "stall", "cpu", "rss", "sync", "refused", "listed")
FLOOR_FIGURES = ("p50", "p99", "all", "stall", "cpu", "rss", "sync")
RATIOS = ("p50", "p99", "all", "cpu", "rss", "sync")
SUMMARY = ("p50", "p99", "cpu", "sync", "rss")


def report_n(
    n: int, per_channel: int, clients: int, groups: int, sides: Mapping[str, Side]
) -> dict[str, float]:
    """Print the figures of one N, their ratios and the summary; return figures and ratios."""
    figures = {kind: _figures(kind, side, n, groups) for kind, side in sides.items()}
    subjects = [kind for kind in sides if kind != FLOOR]
    ordered = [figures[kind][k] for kind in subjects for k in SUBJECT_FIGURES]
    ordered += [figures[FLOOR][k] for k in FLOOR_FIGURES]
    rounds = len(sides[FLOOR].all_acked)
    counts = ", ".join(str(sides[kind].count) for kind in subjects)
    where = f"over {clients} client processes" if clients else "in this process"
    report.print_table(
        f"xds N={n:,}: SotW ADS streams over {-(-n // per_channel)} connections "
        f"({per_channel} per connection, {where}), {groups} groups of {n // groups:,}; one "
        f"EDS change touching every group, {rounds} rounds; servers in their own processes "
        f"(proxy-cp processes: {counts}; replicas each on a port of their own, the "
        f"connections spread evenly; CPU and RSS summed over them)",
        ordered,
    )
    ratios: dict[str, float] = {}
    for kind in subjects:
        for k in RATIOS:
            subject = figures[kind][k]
            ratios[f"{subject.name}/{figures[FLOOR][k].name}@{n}"] = report.ratio_line(
                subject, figures[FLOOR][k]
            )
            if kind != ONE and ONE in figures:
                one = figures[ONE][k]
                ratios[f"{subject.name}/{one.name}@{n}"] = report.ratio_line(
                    subject, one, "one proxy-cp"
                )
    print()
    print_summary(n, groups, sides, figures)
    print()
    return {f"{f.name}@{n}": f.value for f in ordered} | ratios


def print_summary(
    n: int,
    groups: int,
    sides: Mapping[str, Side],
    figures: Mapping[str, Mapping[str, report.Figure]],
) -> None:
    """The table of issue 35 (module docstring), in Markdown."""
    header = (
        "p50",
        "p99",
        "server CPU per change",
        f"{n - groups:,} streams synced",
        "RSS per stream",
    )
    print(f"xds N={n:,} in one table; in brackets: x the floor, x one proxy-cp")
    print("| server | " + " | ".join(header) + " |")
    print("|---" * (len(header) + 1) + "|")
    for kind in [FLOOR, *(k for k in sides if k != FLOOR)]:
        label = "bare grpcio floor (one process)" if kind == FLOOR else sides[kind].name
        cells = [_cell(figures, kind, k) for k in SUMMARY]
        print(f"| {label} | " + " | ".join(cells) + " |")


def _cell(figures: Mapping[str, Mapping[str, report.Figure]], kind: str, k: str) -> str:
    figure = figures[kind][k]
    text = _shown(figure)
    if kind == FLOOR:
        return text
    ratios = [_ratio(figure, figures[FLOOR][k])]
    if kind != ONE and ONE in figures:
        ratios.append(_ratio(figure, figures[ONE][k]))
    return f"{text} ({', '.join(ratios)})"


def _shown(figure: report.Figure) -> str:
    if figure.unit == "s":
        return f"{figure.value:,.2f} s"
    return f"{figure.value:,.{0 if figure.value >= 10 else 1}f} {figure.unit}"


def _ratio(subject: report.Figure, reference: report.Figure) -> str:
    return f"{subject.value / reference.value:.2f}x" if reference.value else "-"
