"""The issues' targets (14, 29 and 35) checked against a run's figures: printed at the end of
every run (:func:`print_targets`), and with ``python -m bench --json FILE`` every figure,
each ratio with its floor, and the targets, as JSON a machine can read.

A benchmark returns its figures by name and its ratios by ``"<subject>/<floor>"`` (with
``@<size>`` when it measures several sizes): that key is where the floor comes from, so the
file names the floor's own figure and value beside each ratio. :data:`TARGETS` says what
the issue asks of each figure; a target whose figure this run did not measure (a benchmark
not run, a smaller size) is listed as ``"measured": false``, never as met.
"""

from __future__ import annotations

import json
import operator
import os
import platform
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Results = Mapping[str, Mapping[str, float]]  # benchmark -> its figures and ratios


@dataclass(frozen=True, slots=True)
class Target:
    benchmark: str
    key: str  # a figure's name or a ratio's key, as the benchmark returns it
    op: str  # "<=" or ">="
    value: float
    what: str


_OPS: dict[str, Callable[[float, float], bool]] = {"<=": operator.le, ">=": operator.ge}

#: What issues 14, 29 and 35 ask, where a benchmark measures it.
TARGETS = (
    # issue 35: one proxy-cp against the bare grpcio floor of the same run
    Target(
        "xds",
        "trellis_cpu_ms/floor_cpu_ms@5000",
        "<=",
        1.3,
        "5,000 streams, one change for all: server CPU per change against the floor",
    ),
    Target(
        "xds",
        "trellis_p99_ms/floor_p99_ms@5000",
        "<=",
        1.5,
        "5,000 streams, one change for all: p99 time to ACK against the floor",
    ),
    Target("xds", "trellis_rss_per_stream_kb@5000", "<=", 40.0, "5,000 streams: RSS per stream"),
    Target(
        "propagation",
        "add_p50_ms",
        "<=",
        10.0,
        "issue 35: VM endpoint added over REST (kept-alive) until a real Envoy serves it: p50",
    ),
    Target(
        "propagation",
        "add_p99_ms",
        "<=",
        30.0,
        "issue 35: the same, p99",
    ),
    Target("xds", "trellis_p99_ms@5000", "<=", 1000.0, "5,000 streams: p99 time to ACK"),
    Target(
        "xds",
        "trellis_sync_s/floor_sync_s@5000",
        "<=",
        1.5,
        "reconnect storm: time to sync against the bare-grpcio floor",
    ),
    Target(
        "xds",
        "replicas_p99_ms@5000",
        "<=",
        1000.0,
        "5,000 streams over proxy-cp replicas: p99 time to ACK",
    ),
    Target("xds", "trellis_sync_refused@5000", "<=", 0.0, "reconnect storm: streams refused"),
    Target(
        "catalog",
        "service_build_ms@1000",
        "<=",
        300.0,
        "full build, 1,000 services, as the service runs it",
    ),
    Target(
        "catalog",
        "service_build_ms_exponent_top",
        "<=",
        1.1,
        "full build growth, 1,000 to 5,000 services (the exponent k of N^k)",
    ),
    Target(
        "catalog",
        "stall_ms@1000",
        "<=",
        50.0,
        "event loop's worst stall over a full build, 1,000 services",
    ),
    Target(
        "catalog",
        "stall_ms@5000",
        "<=",
        50.0,
        "event loop's worst stall over a full build, 5,000 services",
    ),
    Target(
        "certs",
        "proxy_certs/raw_sign",
        ">=",
        0.30,
        "issuance for a CSR (the requester made the key) against raw ECDSA sign",
    ),
    Target(
        "propagation",
        "add_p50_ms",
        "<=",
        15.0,
        "VM endpoint added over REST until a real Envoy serves it: p50",
    ),
    Target(
        "propagation",
        "add_p99_ms",
        "<=",
        50.0,
        "VM endpoint added over REST until a real Envoy serves it: p99",
    ),
    Target(
        "propagation",
        "add_p50_ms@1000",
        "<=",
        15.0,
        "the same with 1,000 other proxies connected: p50",
    ),
    Target(
        "propagation",
        "add_p99_ms@1000",
        "<=",
        50.0,
        "the same with 1,000 other proxies connected: p99",
    ),
    Target(
        "propagation",
        "spec_p50_ms",
        "<=",
        100.0,
        "spec edit (a file in the spec directory) until a real Envoy serves it: p50",
    ),
    Target(
        "propagation",
        "churn_add_p50_ms/add_p50_ms",
        "<=",
        2.0,
        "VM endpoint added during 100 endpoint changes/s, against idle: p50",
    ),
    Target(
        "propagation",
        "churn_add_p99_ms/add_p99_ms",
        "<=",
        2.0,
        "VM endpoint added during 100 endpoint changes/s, against idle: p99",
    ),
    Target(
        "propagation",
        "churn_spec_p50_ms/spec_p50_ms",
        "<=",
        2.0,
        "spec edit during 100 endpoint changes/s, against idle: p50",
    ),
    # issue 29: services that start in a second
    *(
        Target("startup", f"{name}_ready_s", "<=", 2.0, f"{name}: exec until /readyz is 200")
        for name in ("certmanager", "endpoints-vm", "catalog", "proxy-cp", "injector")
    ),
    Target("startup", "up_s", "<=", 6.0, "trellis up --no-demo until every /readyz is 200"),
)


def _ratio(key: str, figures: Mapping[str, float], value: float) -> dict[str, Any]:
    pair, at, size = key.partition("@")
    subject, _, floor = pair.partition("/")
    suffix = f"{at}{size}"
    return {
        "key": key,
        "ratio": value,
        "figure": subject + suffix,
        "value": figures.get(subject + suffix),
        "floor": floor + suffix,
        "floor_value": figures.get(floor + suffix),
    }


def document(results: Results, seconds: float, warmup: float) -> dict[str, Any]:
    benchmarks = {}
    for name, found in results.items():
        figures = {k: v for k, v in found.items() if "/" not in k}
        ratios = [_ratio(k, figures, v) for k, v in found.items() if "/" in k]
        benchmarks[name] = {"figures": figures, "ratios": ratios}
    targets = []
    for target in TARGETS:
        value = results.get(target.benchmark, {}).get(target.key)
        entry: dict[str, Any] = {
            "benchmark": target.benchmark,
            "key": target.key,
            "what": target.what,
            "target": f"{target.op} {target.value:g}",
            "measured": value is not None,
        }
        if value is not None:
            entry |= {"value": value, "met": _OPS[target.op](value, target.value)}
        targets.append(entry)
    return {
        "machine": {
            "python": platform.python_version(),
            "arch": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "run": {"seconds": seconds, "warmup": warmup},
        "benchmarks": benchmarks,
        "targets": targets,
    }


def print_targets(results: Results) -> None:
    """Each target of the benchmarks that ran: its figure (with the floor's, for a ratio),
    what is asked, and met, NOT MET, or not measured in this run (a smaller size)."""
    ran = [t for t in TARGETS if t.benchmark in results]
    if not ran:
        return
    print("\ntargets (issues 14, 29, 35), from this run's figures and floors:")
    met = measured = 0
    for target in ran:
        found = results[target.benchmark]
        value = found.get(target.key)
        if value is None:
            verdict, shown = "not measured", "-"
        else:
            measured += 1
            ok = _OPS[target.op](value, target.value)
            met += ok
            verdict, shown = ("met" if ok else "NOT MET"), f"{value:,.2f}"
            if "/" in target.key:
                ratio = _ratio(target.key, found, value)
                floor = ratio["floor_value"]
                if floor is not None:
                    shown += f"x (floor {ratio['floor']} {floor:,.2f})"
        print(
            f"  {verdict:>12}  {target.benchmark}/{target.key} = {shown}; "
            f"wanted {target.op} {target.value:g}: {target.what}"
        )
    print(f"  {met} of {measured} measured targets met ({len(ran) - measured} not measured)")


def write(path: Path, results: Results, seconds: float, warmup: float) -> None:
    path.write_text(json.dumps(document(results, seconds, warmup), indent=2) + "\n")
