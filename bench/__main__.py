"""``python -m bench [NAME ...]``: run the benchmarks, all of them in order by default.

:data:`BENCHMARKS` is the registry: a name and a ``run(*, seconds, warmup)`` callable per
module (see :class:`bench.report.Benchmark`). A new benchmark module adds one line here.

Each of several benchmarks runs in a process of its own (``python -m bench NAME``), as it
runs alone: none inherits another's heap, threads or collector state. ``xds``'s simulated
clients leave a process with about 800 MB, and ``propagation``'s observer and its POSTs
run in the benchmark's own process.

``xds`` takes options of its own (``--streams``, ``--clients``, ``--replicas``: where its
streams and servers run, :class:`bench.xds.Layout`); they are refused for a run that
leaves ``xds`` out, and passed on to its child.
"""

from __future__ import annotations

import argparse
import functools
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
    policy,
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
    "policy": policy.run,
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


def _counts(field: str, least: int, most: int | None = None) -> functools.partial[tuple[int, ...]]:
    """An argparse type: ``"1,2,4"`` as counts (:func:`bench.xds.counts`)."""
    return functools.partial(_parsed, field, least, most)


def _parsed(field: str, least: int, most: int | None, text: str) -> tuple[int, ...]:
    try:
        return xds.counts(text, field, least, most)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{field}: ")) from None


XDS_OPTIONS = ("streams", "clients", "replicas")


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
    layout = parser.add_argument_group("xds", "where the xds benchmark's streams and servers run")
    layout.add_argument(
        "--streams",
        type=_counts("--streams", xds.GROUPS * 2),
        metavar="N[,N...]",
        help="simulated ADS streams per server (default: 1,000 and 5,000; 200 and 1,000 "
        "with --seconds below 1)",
    )
    layout.add_argument(
        "--clients",
        type=_counts("--clients", 1, xds.MAX_CLIENTS),
        metavar="C",
        help="spread the streams over C client processes (default: in the benchmark's own)",
    )
    layout.add_argument(
        "--replicas",
        type=_counts("--replicas", 1, xds.MAX_REPLICAS),
        metavar="R[,R...]",
        help="proxy-cp process counts, each measured beside the floor, e.g. 1,2,4,8 "
        "(default: 1 and TRELLIS_BENCH_XDS_REPLICAS, 2)",
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    given = [f"--{name}" for name in XDS_OPTIONS if getattr(args, name) is not None]
    if given and args.names and "xds" not in args.names:
        parser.error(
            f"{', '.join(given)}: for the xds benchmark only, and this run leaves it out "
            "(python -m bench xds ...)"
        )
    if args.clients is not None and len(args.clients) != 1:
        parser.error("--clients: one count, e.g. --clients 6")
    return args


def _layout(args: argparse.Namespace) -> xds.Layout:
    return xds.Layout(
        streams=args.streams or (),
        clients=args.clients[0] if args.clients else 0,
        replicas=args.replicas or (),
    )


def _xds_argv(args: argparse.Namespace) -> list[str]:
    """The xds options as given, for a child."""
    found: list[str] = []
    for name in XDS_OPTIONS:
        value = getattr(args, name)
        if value is not None:
            found += [f"--{name}", ",".join(str(v) for v in value)]
    return found


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
    benchmarks = BENCHMARKS | {"xds": functools.partial(xds.run, layout=_layout(args))}
    for name in names:
        print(flush=True)
        if len(names) == 1:
            results[name] = benchmarks[name](seconds=args.seconds, warmup=args.warmup)
        else:
            extra = _xds_argv(args) if name == "xds" else []
            found = _in_child(name, args.seconds, args.warmup, extra)
            if found is None:
                print(f"\nbenchmark {name} failed (its output is above); stopped", flush=True)
                return 1
            results[name] = found
    if args.results_to is None:  # a child's results are printed by its parent
        figures.print_targets(results)
    if args.results_to is not None:
        args.results_to.write_text(json.dumps(results))
    if args.json is not None:
        figures.write(args.json, results, args.seconds, args.warmup)
        print(f"\nfigures, ratios and targets written to {args.json}")
    return 0


def _in_child(
    name: str, seconds: float, warmup: float, extra: list[str] | None = None
) -> dict[str, float] | None:
    """Run benchmark ``name`` in a process of its own (its output passes through); its
    results, or None if it failed."""
    with tempfile.TemporaryDirectory(prefix="trellis-bench-") as folder:
        answer = Path(folder) / "results.json"
        command = [sys.executable, "-m", "bench", name, "--seconds", f"{seconds!r}"]
        command += ["--warmup", f"{warmup!r}", "--results-to", str(answer), *(extra or [])]
        if subprocess.run(command, check=False).returncode != 0 or not answer.exists():
            return None
        found: dict[str, dict[str, float]] = json.loads(answer.read_text())
        return found[name]


if __name__ == "__main__":
    sys.exit(main())
