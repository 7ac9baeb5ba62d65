"""``python -m bench [NAME ...]``: run the benchmarks, all of them in order by default.

:data:`BENCHMARKS` is the registry: a name and a ``run(*, seconds, warmup)`` callable per
module (see :class:`bench.report.Benchmark`). A new benchmark module adds one line here.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

from bench import catalog, certs, destination, endpoints, figures, propagation, report, xds

BENCHMARKS: dict[str, report.Benchmark] = {
    "certs": certs.run,
    "endpoints": endpoints.run,
    "catalog": catalog.run,
    "xds": xds.run,
    "destination": destination.run,
    "propagation": propagation.run,
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
        print()
        results[name] = BENCHMARKS[name](seconds=args.seconds, warmup=args.warmup)
    if args.json is not None:
        figures.write(args.json, results, args.seconds, args.warmup)
        print(f"\nfigures, ratios and targets written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
