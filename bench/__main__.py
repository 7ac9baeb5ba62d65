"""``python -m bench [NAME ...]``: run the benchmarks, all of them in order by default.

:data:`BENCHMARKS` is the registry: a name and a ``run(*, seconds, warmup)`` callable per
module (see :class:`bench.report.Benchmark`). A new benchmark module adds one line here.

Each of several benchmarks runs in a process of its own (``python -m bench NAME``), as it
runs alone: none inherits another's heap, threads or collector state. ``xds``'s simulated
clients leave a process with about 800 MB, and ``propagation``'s observer and its POSTs
run in the benchmark's own process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import (
    catalog,
    certs,
    destination,
    endpoints,
    figures,
    propagation,
    report,
    startup,
    xds,
)

BENCHMARKS: dict[str, report.Benchmark] = {
    "certs": certs.run,
    "endpoints": endpoints.run,
    "catalog": catalog.run,
    "xds": xds.run,
    "destination": destination.run,
    "propagation": propagation.run,
    "startup": startup.run,
}


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Trellis benchmarks: figures, and ratios against a floor or baseline "
        "measured in the same run.",
        epilog=f"benchmarks, in run order: {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="benchmarks to run (default: all, in order)"
    )
    parser.add_argument(
        "--seconds",
        type=_positive,
        default=2.0,
        help="measured duration of each figure, in seconds (default: 2)",
    )
    parser.add_argument(
        "--warmup",
        type=_non_negative,
        default=0.2,
        help="unmeasured warm-up before each figure, in seconds (default: 0.2)",
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--results-to", type=Path, help=argparse.SUPPRESS)  # a child's answer
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="also write every figure, ratio (with its floor) and target to FILE as JSON",
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for name in BENCHMARKS:
            print(name)
        return 0
    names = args.names or list(BENCHMARKS)
    print(
        f"python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} cpus; --seconds {args.seconds:g} --warmup {args.warmup:g}"
    )
    results = {}
    for name in names:
        print(flush=True)
        if len(names) == 1:
            results[name] = BENCHMARKS[name](seconds=args.seconds, warmup=args.warmup)
        else:
            found = _in_child(name, args.seconds, args.warmup)
            if found is None:
                print(f"\nbenchmark {name} failed (its output is above); stopped", flush=True)
                return 1
            results[name] = found
    if args.results_to is not None:
        args.results_to.write_text(json.dumps(results))
    if args.json is not None:
        figures.write(args.json, results, args.seconds, args.warmup)
        print(f"\nfigures, ratios and targets written to {args.json}")
    return 0


def _in_child(name: str, seconds: float, warmup: float) -> dict[str, float] | None:
    """Run benchmark ``name`` in a process of its own (its output passes through); its
    results, or None if it failed."""
    with tempfile.TemporaryDirectory(prefix="trellis-bench-") as folder:
        answer = Path(folder) / "results.json"
        command = [sys.executable, "-m", "bench", name, "--seconds", f"{seconds!r}"]
        command += ["--warmup", f"{warmup!r}", "--results-to", str(answer)]
        if subprocess.run(command, check=False).returncode != 0 or not answer.exists():
            return None
        found: dict[str, dict[str, float]] = json.loads(answer.read_text())
        return found[name]


if __name__ == "__main__":
    sys.exit(main())
