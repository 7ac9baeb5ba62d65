"""Load beside a measurement, in a process of its own: connected proxies, endpoint churn.

The propagation benchmark (:mod:`bench.propagation`) times single changes with a poll loop
that must not wait behind the load it measures under, so the load runs here:
``python -m bench.background STATE_DIR --streams N --clients C --rate R`` finds the mesh
through its state directory and

* onboards ``N`` simulated proxies (:func:`bench.fullmesh.issue` and :func:`~bench.fullmesh.fleet`:
  a proxy certificate and an mTLS ADS stream each, every push ACKed), ``C`` of them
  bookbuyer's (they get every bookstore change, as the measured Envoy does), the rest
  bookthief's;
* churns bookstore-v1's VM workloads at ``R`` changes per second over the endpoints-vm REST
  API, as the soak does (:class:`bench.soak.Churn`: one added, the oldest removed, in turn,
  :data:`bench.soak.KEEP` alive).

It writes one JSON line when the streams are synced and the churn has filled its live set,
runs until its stdin is closed, then deregisters the churn's workloads (the mesh is left as
it found it), closes the streams and writes a JSON line of what it did. :class:`Background`
is the measuring side: a context manager around that process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from bench import fullmesh, load, rest, soak, xds_server
from trellis_testing.waiting import eventually

ROOT = Path(__file__).resolve().parent.parent  # where ``python -m bench.background`` works
SYNC_TIMEOUT = 600.0
STOP_TIMEOUT = 60.0
FILL_TIMEOUT = 120.0


class Background:
    """``python -m bench.background`` as a context manager: entered once the load is
    running, left once the process has undone its churn and exited; :attr:`summary` is its
    last line."""

    def __init__(
        self, state_dir: Path, log: Path, *, streams: int = 0, clients: int = 0, rate: float = 0
    ) -> None:
        self._args = [str(state_dir), f"--streams={streams}", f"--clients={clients}"]
        self._args.append(f"--rate={rate:g}")
        self._log = log
        self._process: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.summary: dict[str, Any] = {}

    def __enter__(self) -> Background:
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "bench.background", *self._args],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        try:
            self.ready = self._line()
        except BaseException:
            self._end()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._process is not None
        assert self._process.stdin is not None
        self._process.stdin.close()  # the process stops its load
        try:
            if error is None:
                self.summary = self._line()
        finally:
            self._end()

    def _line(self) -> dict[str, Any]:
        assert self._process is not None
        assert self._process.stdout is not None
        line = self._process.stdout.readline()  # the process bounds its own waits
        if not line:
            tail = self._log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the background load exited; the end of its log:\n{tail}")
        found: dict[str, Any] = json.loads(line)
        return found

    def _end(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()  # the process stops its load and exits
        for signal in (None, process.terminate, process.kill):
            if signal is not None:
                signal()
            try:
                process.wait(STOP_TIMEOUT)
                return
            except subprocess.TimeoutExpired:
                continue


def _say(message: dict[str, Any]) -> None:
    print(json.dumps(message), flush=True)


async def _load(args: argparse.Namespace) -> None:
    fleet = None
    if args.streams:
        xds_server.raise_open_files(65536)
        issued = await fullmesh.issue(args.state_dir, args.streams, args.clients)
        fleet = fullmesh.fleet(args.state_dir, issued)
    churn = soak.Churn(rest.LeanClient(**fullmesh.endpoints_vm(args.state_dir)), None)
    try:
        sync_s = await fleet.connect(args.streams, SYNC_TIMEOUT) if fleet else 0.0
        runner = asyncio.create_task(churn.run(args.rate, float("inf"))) if args.rate else None
        if runner is not None:  # from KEEP alive on, one added and one removed in turn
            await eventually(lambda: len(churn.live) >= soak.KEEP, FILL_TIMEOUT, 0.05)
        started, changes = time.monotonic(), _changes(churn)
        _say({"streams": args.streams, "sync_s": sync_s, "refused": fleet.retries if fleet else 0})
        await asyncio.to_thread(sys.stdin.read)  # until the measuring process closes it
        seconds, changes = time.monotonic() - started, _changes(churn) - changes
        if runner is not None:
            churn.stop()
            await runner
            await _undo(churn)
        _say(
            {
                "changes": changes,
                "rate": changes / seconds if seconds > 0 else 0.0,
                "rest_failures": churn.failures,
                "first_rest_failure": churn.first_failure,
                "stream_failure": repr(fleet.failure) if fleet and fleet.failure else "",
            }
        )
    finally:
        await churn.client.aclose()
        if fleet is not None:
            await fleet.close()


def _changes(churn: soak.Churn) -> int:
    """Changes made so far: every workload added, and every one removed again."""
    return 2 * churn.made - len(churn.live)


async def _undo(churn: soak.Churn) -> None:
    async def remove(index: int) -> None:
        name, _ = churn.live[index]
        response = await churn.client.delete(f"/v1/workloads/bookstore/{name}")
        load.expect_status(response, 204)

    await load.in_flight(remove, range(len(churn.live)), soak.IN_FLIGHT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.background", description=__doc__.split("\n")[0]
    )
    parser.add_argument("state_dir", type=Path, help="the running mesh's state directory")
    parser.add_argument("--streams", type=int, default=0, help="simulated proxies to connect")
    parser.add_argument("--clients", type=int, default=0, help="of them, bookbuyer's")
    parser.add_argument("--rate", type=float, default=0.0, help="endpoint changes per second")
    args = parser.parse_args(argv)
    load.fail_fast_sniffio_import()
    asyncio.run(_load(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
