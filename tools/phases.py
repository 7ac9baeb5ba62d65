"""``make test``: every phase, timed, with mypy beside the rest.

``make test`` is bound by CPU on the 2-core machine it runs on, except for its checks: mypy
is one process for about 75 s on a clean clone, and lint, the layer contracts and the proto
check are one process at a time too. Run one after another, a core stood idle for about a
minute and a half. So after ``bootstrap`` two lanes run at once:

* lane A: ``typecheck``;
* lane B: ``lint``, ``imports``, ``proto-check``, ``pytest-cache``, then ``pytest``.

Lane B's output streams as it comes; lane A's is kept and printed when it ends, so the two
never interleave. A failing phase stops its own lane; the other lane runs to its end, so one
run reports every failure it can. The exit status is lane B's failure, else lane A's.

Each phase prints one line at the end: how long it took, and when it started (seconds from
the start of ``make test``), since two lanes' times add up to more than the wall time.

Standard library only: it runs with the system's ``python3`` before ``bootstrap`` has made
the workspace's environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

FIRST = ("bootstrap",)
LANE_A = ("typecheck",)
LANE_B = ("lint", "imports", "proto-check", "pytest-cache", "pytest")


@dataclass
class Done:
    phase: str
    started: float
    took: float
    status: int


class Run:
    def __init__(self, make: str) -> None:
        self.make = make
        self.t0 = time.monotonic()
        self.done: list[Done] = []
        self.lock = threading.Lock()

    def phase(self, name: str, *, buffered: bool) -> int:
        started = time.monotonic()
        argv = [self.make, "--no-print-directory", name]
        if buffered:
            with tempfile.TemporaryFile(mode="w+") as out:
                status = subprocess.call(argv, stdout=out, stderr=subprocess.STDOUT)
                out.seek(0)
                text = out.read()
            with self.lock:
                sys.stdout.write(text)
                sys.stdout.flush()
        else:
            status = subprocess.call(argv)
        with self.lock:
            self.done.append(Done(name, started - self.t0, time.monotonic() - started, status))
        return status

    def lane(self, phases: tuple[str, ...], *, buffered: bool = False) -> int:
        for name in phases:
            status = self.phase(name, buffered=buffered)
            if status:
                return status
        return 0

    def report(self) -> str:
        lines = []
        for done in sorted(self.done, key=lambda d: d.started):
            failed = f"  FAILED ({done.status})" if done.status else ""
            lines.append(
                f"make test: {done.phase:<12} {done.took:6.1f} s"
                f"  (from {done.started:5.1f} s){failed}"
            )
        lines.append(f"make test: {'in all':<12} {time.monotonic() - self.t0:6.1f} s")
        return "\n".join(lines)


def main() -> int:
    run = Run(os.environ.get("MAKE", "make"))
    status = run.lane(FIRST)
    if status == 0:
        lane_a: list[int] = []
        beside = threading.Thread(
            target=lambda: lane_a.append(run.lane(LANE_A, buffered=True)), daemon=True
        )
        beside.start()
        status_b = run.lane(LANE_B)
        beside.join()
        status = status_b or lane_a[0]
    report = run.report()
    print(report)
    tools = Path(os.environ.get("TOOLS", ".tools"))
    tools.mkdir(exist_ok=True)
    (tools / "phases.txt").write_text(report + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
