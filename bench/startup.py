"""How long a Trellis process takes from exec until it serves, against bare Python.

Every integration test, every ``trellis up`` and every restart after a crash pays a
service's start; every ``trellis vm heartbeat`` pays the CLI's. The figures, each the median
of ``ROUNDS`` starts:

* ``python_pass_s``: ``python -c pass``, exec to exit: the floor no Python process beats;
* ``cli_help_s``: ``trellis --help``, exec to exit;
* ``<service>_ready_s``: ``python -m trellis_<service>.main`` with free ports, exec until its
  ``/readyz`` answers 200 (beside a real Redis; certmanager already up for the others,
  which join with it, as in a mesh);
* ``up_s``: ``trellis up --no-demo`` until every service's ``/readyz`` is 200 (its "Trellis
  is up" line). It runs on the default ports (15010-15061, Redis on 16379): they must be free.

The issue's targets (issue 29): each service ready within 2 s of exec, ``trellis up
--no-demo`` within 6 s, on an idle machine (:data:`bench.figures.TARGETS`).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import report
from trellis_testing.redis_server import RedisServer
from trellis_testing.services import ServiceProcess

ROUNDS = 3
#: (component, module) of each service measured on its own; certmanager first.
SERVICES = (
    ("certmanager", "trellis_certmanager.main"),
    ("endpoints-vm", "trellis_endpoints_vm.main"),
    ("catalog", "trellis_catalog.main"),
    ("proxy-cp", "trellis_proxy_cp.main"),
    ("injector", "trellis_injector.main"),
)
UP_TIMEOUT = 60.0


def _median(times: list[float]) -> float:
    return statistics.median(times)


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def _ready_time(process: ServiceProcess) -> float:
    start = time.perf_counter()
    process.start(timeout=60)
    return time.perf_counter() - start


def services(root: Path, rounds: int) -> dict[str, float]:
    """Each service, exec until ready, ``rounds`` times (median), in a mesh's order: each
    measured one then keeps running for the next, which may need it (proxy-cp is ready once
    it has the catalog's views)."""
    found: dict[str, float] = {}
    with RedisServer(dir=root / "redis") as redis:
        state = root / "state"
        state.mkdir()
        running: list[ServiceProcess] = []
        try:
            for name, module in SERVICES:
                process = ServiceProcess(name, module, state, redis)
                times = []
                for number in range(rounds):
                    times.append(_ready_time(process))
                    if number < rounds - 1:
                        process.stop()
                running.append(process)  # the last start stays up for the next service
                found[name] = _median(times)
        finally:
            for process in reversed(running):
                process.stop()
    return found


def up(root: Path, rounds: int) -> float:
    """``trellis up --no-demo`` until "Trellis is up", ``rounds`` times (median); each run
    is stopped with SIGINT, as Ctrl-C stops it, before the next."""
    times = []
    for number in range(rounds):
        state = root / f"up-{number}"
        log = root / f"up-{number}.log"
        command = [sys.executable, "-m", "trellis_cli.main", "--state-dir", str(state)]
        command += ["up", "--no-demo", "--quiet"]
        with log.open("wb") as sink:
            start = time.perf_counter()
            process = subprocess.Popen(
                command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env={**os.environ, "COLUMNS": "200"},
                start_new_session=True,
            )
            try:
                _wait(process, log)
                times.append(time.perf_counter() - start)
            finally:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    return _median(times)


def _wait(process: subprocess.Popen[bytes], log: Path) -> None:
    """Until ``trellis up`` says it is up (every service's ``/readyz`` answered)."""
    deadline = time.monotonic() + UP_TIMEOUT
    while "Trellis is up" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"trellis up did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)


def run(*, seconds: float = 2.0, warmup: float = 0.2, with_up: bool = True) -> dict[str, float]:
    """A start is measured whole, so ``--seconds`` sets the number of rounds instead:
    ``ROUNDS`` at the default 2 s, one at 0.5 s or less (a test's quick run); there is no
    warm-up. ``with_up=False`` leaves ``trellis up`` out (its ports are fixed)."""
    del warmup
    rounds = max(1, round(seconds * ROUNDS / 2))
    floor = _median([_timed([sys.executable, "-c", "pass"]) for _ in range(max(rounds, 5))])
    cli = _median(
        [_timed([sys.executable, "-m", "trellis_cli.main", "--help"]) for _ in range(rounds)]
    )
    root = Path(tempfile.mkdtemp(prefix="trellis-bench-startup-"))
    try:
        ready = services(root, rounds)
        up_s = up(root, rounds) if with_up else None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = report.Figure("python_pass_s", floor, "s", "python -c pass, exec to exit (floor)")
    figures = [base, report.Figure("cli_help_s", cli, "s", "trellis --help, exec to exit")]
    for name, value in ready.items():
        figures.append(
            report.Figure(f"{name}_ready_s", value, "s", "exec until /readyz is 200 (target 2)")
        )
    if up_s is not None:
        figures.append(
            report.Figure("up_s", up_s, "s", "trellis up --no-demo until every /readyz (target 6)")
        )
    report.print_table(f"start-up, median of {rounds}", figures)
    ratios = {
        f"{figure.name}/python_pass_s": report.ratio_line(figure, base) for figure in figures[1:]
    }
    return report.results(figures, ratios)
