"""``make soak``: endpoint churn through the whole control plane, with 1,000 xDS streams.

The requirement (issue 14): 100 changes per second for 10 minutes at 1,000 streams; RSS
flat after warm-up (at most 5% growth) and a p99 lag that does not grow. Not part of
``make test``: it takes the minutes it measures.

What runs, all real: Redis, certmanager, endpoints-vm, the catalog and proxy-cp as
processes (:class:`trellis_testing.mesh.Mesh`, the end-to-end tests' harness) on
the bookstore example, with its three Envoy sidecars. This process then onboards
``--streams`` simulated bookbuyer proxies: a proxy certificate each, issued by certmanager
for a key made here, and an ADS stream each on its own mTLS connection to proxy-cp
(:class:`bench.xds_client.Fleet`: Envoy's SotW walk, every push ACKed).

The churn: ``--rate`` changes per second to bookstore-v1's VM workloads over the
endpoints-vm REST API (``POST /v1/workloads`` and ``DELETE``), keeping :data:`KEEP` extra
workloads alive: one added, the oldest removed, in turn. Each change goes endpoints-vm →
Redis → catalog → proxy-cp → every bookbuyer stream. Its **lag** is from the REST call to
the first EDS response on stream 0 that shows it (the address present, or gone); every
bookbuyer stream gets the same snapshot.

Every :data:`WINDOW` seconds a line: the lags of the changes seen in the window (p50, p99),
changes still unseen, REST failures, stream failures, and each process's RSS
(``/proc/<pid>/status``). After the warm-up, the verdict compares each process's RSS at the
end with its RSS when the warm-up ended (growth at most :data:`RSS_GROWTH`), and the p99 lag
of the second half of the measured time with the first (at most :data:`LAG_GROWTH` times);
a change unseen for :data:`LOST_AFTER` seconds is lost, and none may be. Exit status 1 when
a check fails. ``--json FILE`` writes every window and the verdict.

    make soak                                   # 10 minutes, 100/s, 1,000 streams
    make soak SOAK_ARGS='--minutes 2 --streams 200'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from envoy.config.endpoint.v3 import endpoint_pb2

from bench import fullmesh, load, rest, xds_client, xds_server
from trellis_identity import tokens
from trellis_proxy_cp.types import ENDPOINT
from trellis_testing.mesh import Mesh

CLIENTS = 100  # of the streams, bookbuyer's: every change reaches them
KEEP = 200  # extra bookstore-v1 workloads alive at any time: each lives KEEP / (rate / 2) s
WINDOW = 30.0  # seconds per report line
WARMUP = 120.0  # seconds of churn before the measured time
RSS_GROWTH = 0.05
LAG_GROWTH = 1.25
LOST_AFTER = 30.0  # seconds: a change not seen by then is lost
IN_FLIGHT = 16  # REST calls in flight at most
CLUSTER = "bookstore/bookstore-v1|"  # the prefix of the EDS cluster the churn moves
SYNC_TIMEOUT = 600.0
PROCESSES = ("certmanager", "endpoints-vm", "catalog", "proxy-cp")


@dataclass
class Seen:
    at: float  # monotonic seconds
    kind: str  # "add" or "remove"
    lag: float


@dataclass
class Probe:
    """Times each change from its REST call to the first EDS response on stream 0 that
    shows it (see the module's docstring)."""

    adds: dict[str, float] = field(default_factory=dict)  # address -> sent
    removes: dict[str, float] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    superseded: int = 0  # adds removed before any push showed them (nothing to see)

    def removing(self, address: str) -> None:
        if self.adds.pop(address, None) is not None:
            self.superseded += 1
        self.removes[address] = time.monotonic()

    def watch(self, index: int, response: Any) -> None:
        if index != 0 or response.type_url != ENDPOINT:
            return
        now = time.monotonic()
        addresses: set[str] | None = None
        for packed in response.resources:
            assignment = endpoint_pb2.ClusterLoadAssignment()
            packed.Unpack(assignment)
            if not assignment.cluster_name.startswith(CLUSTER):
                continue
            addresses = {
                lb.endpoint.address.socket_address.address
                for locality in assignment.endpoints
                for lb in locality.lb_endpoints
            }
        if addresses is None:
            return  # the response does not carry bookstore-v1's assignment
        for address in [a for a in self.adds if a in addresses]:
            self.seen.append(Seen(now, "add", now - self.adds.pop(address)))
        for address in [a for a in self.removes if a not in addresses]:
            self.seen.append(Seen(now, "remove", now - self.removes.pop(address)))

    def unseen(self, older_than: float) -> int:
        cutoff = time.monotonic() - older_than
        return sum(1 for sent in [*self.adds.values(), *self.removes.values()] if sent < cutoff)


@dataclass
class Churn:
    """``rate`` changes per second to bookstore-v1's workloads (see the module's docstring);
    ``probe``, when given, times each change."""

    client: httpx.AsyncClient | rest.LeanClient  # the lean one where only load is wanted
    probe: Probe | None
    live: deque[tuple[str, str]] = field(default_factory=deque)  # (name, address), oldest first
    made: int = 0
    failures: int = 0
    first_failure: str = ""
    rest: list[float] = field(default_factory=list)  # POST round trips, seconds
    rest_reported: int = 0  # how many of them a window has reported
    _slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(IN_FLIGHT))
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _stopped: bool = False

    def stop(self) -> None:
        """End :meth:`run` before ``until``; it still awaits the calls in flight."""
        self._stopped = True

    async def run(self, rate: float, until: float) -> None:
        interval, tick = 1.0 / rate, time.monotonic()
        while tick < until and not self._stopped:
            await self._slots.acquire()  # a slow control plane slows the churn, it never piles up
            task = asyncio.create_task(self._change())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            tick += interval
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
        await asyncio.gather(*self._tasks)

    async def _change(self) -> None:
        try:
            if len(self.live) >= KEEP:  # only workloads whose registration was answered
                name, address = self.live.popleft()
                if self.probe is not None:
                    self.probe.removing(address)
                response = await self.client.delete(f"/v1/workloads/bookstore/{name}")
                load.expect_status(response, 204)
            else:
                self.made += 1
                name, address = f"soak-{self.made}", load.address(self.made, network=200)
                sent = time.monotonic()
                if self.probe is not None:
                    self.probe.adds[address] = sent
                response = await self.client.post("/v1/workloads", json=_body(name, address))
                load.expect_status(response, 201)
                self.rest.append(time.monotonic() - sent)
                self.live.append((name, address))
        except (httpx.HTTPError, RuntimeError) as exc:
            self.failures += 1
            self.first_failure = self.first_failure or repr(exc)[:300]
        finally:
            self._slots.release()


def _body(name: str, address: str) -> dict[str, Any]:
    return {
        "namespace": "bookstore",
        "name": name,
        "services": ["bookstore-v1"],
        "address": address,
        "ports": [{"name": "http", "number": 14001}],
        "service_account": "bookstore",
    }


def _rss(mesh: Mesh) -> dict[str, int]:
    found = {}
    for name in PROCESSES:
        process = mesh.processes[name].process
        if process is None or process.poll() is not None:
            raise RuntimeError(f"{name} is not running")
        for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                found[name] = int(line.split()[1]) * 1024
    return found


def _p(values: Sequence[float], q: float) -> float:
    return load.percentile(values, q) * 1000 if values else float("nan")


async def soak(mesh: Mesh, args: argparse.Namespace) -> dict[str, Any]:
    xds_server.raise_open_files(65536)
    clients = min(args.clients, args.streams)
    issued = await fullmesh.issue(mesh.state_dir, args.streams, clients)
    print(
        f"issued {len(issued):,} proxy certificates: {clients:,} bookbuyer, "
        f"{len(issued) - clients:,} bookthief",
        flush=True,
    )
    probe = Probe()
    fleet = fullmesh.fleet(mesh.state_dir, issued, watch=probe.watch)
    token = tokens.load_or_create_admin_token(mesh.state_dir)
    windows: list[dict[str, Any]] = []
    try:
        sync_s = await fleet.connect(args.streams, SYNC_TIMEOUT)
        refused = f"; {fleet.retries} refused and retried ({fleet.retry_reason!r:.200})"
        print(
            f"{args.streams:,} streams synced in {sync_s:.1f} s"
            + (refused if fleet.retries else ""),
            flush=True,
        )
        async with mesh.processes["endpoints-vm"].async_client(
            headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as client:
            churn = Churn(client, probe)
            start = time.monotonic()
            end = start + args.warmup + args.minutes * 60
            runner = asyncio.create_task(churn.run(args.rate, end))
            window_start, counted = start, 0
            while not runner.done():
                await asyncio.wait(
                    {runner}, timeout=max(0.0, window_start + WINDOW - time.monotonic())
                )
                now = time.monotonic()
                fresh = probe.seen[counted:]
                counted = len(probe.seen)
                window = _window(window_start - start, now - start, fresh, probe, churn, mesh)
                window["measured"] = window_start - start >= args.warmup
                windows.append(window)
                _print(window)
                window_start = now
            await runner
            await asyncio.sleep(min(LOST_AFTER, 5.0))  # the last changes' pushes
    finally:
        await fleet.close()
    return _verdict(windows, probe, churn, fleet, args)


def _window(
    since: float, until: float, fresh: list[Seen], probe: Probe, churn: Churn, mesh: Mesh
) -> dict[str, Any]:
    adds = [s.lag for s in fresh if s.kind == "add"]
    posts, churn.rest_reported = churn.rest[churn.rest_reported :], len(churn.rest)
    removes = [s.lag for s in fresh if s.kind == "remove"]
    return {
        "from_s": round(since, 1),
        "to_s": round(until, 1),
        "changes_seen": len(fresh),
        "rate": len(fresh) / (until - since) if until > since else 0.0,
        "lags_s": [s.lag for s in fresh],
        "add_p50_ms": _p(adds, 0.5),
        "add_p99_ms": _p(adds, 0.99),
        "remove_p50_ms": _p(removes, 0.5),
        "remove_p99_ms": _p(removes, 0.99),
        "post_p50_ms": _p(posts, 0.5),
        "post_p99_ms": _p(posts, 0.99),
        "unseen": probe.unseen(LOST_AFTER),
        "rest_failures": churn.failures,
        "rss": _rss(mesh),
    }


def _print(window: dict[str, Any]) -> None:
    rss = " ".join(f"{k}={v / 2**20:.1f}MB" for k, v in window["rss"].items())
    print(
        f"  {window['from_s']:>6.0f}-{window['to_s']:<6.0f}s {window['rate']:6.1f}/s seen  "
        f"add p50 {window['add_p50_ms']:6.0f} p99 {window['add_p99_ms']:6.0f} ms  "
        f"remove p50 {window['remove_p50_ms']:6.0f} p99 {window['remove_p99_ms']:6.0f} ms  "
        f"POST p50 {window['post_p50_ms']:5.0f} p99 {window['post_p99_ms']:5.0f} ms  "
        f"lost {window['unseen']}  REST failures {window['rest_failures']}  {rss}"
        + ("" if window["measured"] else "  (warm-up)"),
        flush=True,
    )


def _verdict(
    windows: list[dict[str, Any]],
    probe: Probe,
    churn: Churn,
    fleet: xds_client.Fleet,
    args: argparse.Namespace,
) -> dict[str, Any]:
    measured = [w for w in windows if w["measured"]]
    if len(measured) < 2:
        raise RuntimeError("the measured time holds fewer than two windows: raise --minutes")
    warm = [w for w in windows if not w["measured"]]
    baseline = (warm or measured)[-1]["rss"]
    final = measured[-1]["rss"]
    growth = {name: final[name] / baseline[name] - 1 for name in baseline}
    half = len(measured) // 2
    first = [lag for w in measured[:half] for lag in w["lags_s"]]
    second = [lag for w in measured[half:] for lag in w["lags_s"]]
    p99_first, p99_second = _p(first, 0.99), _p(second, 0.99)
    lost = probe.unseen(0.0)
    checks = {
        "rss_flat": all(g <= RSS_GROWTH for g in growth.values()),
        "p99_lag_flat": p99_second <= LAG_GROWTH * p99_first,
        "none_lost": lost == 0,
        "no_rest_failures": churn.failures == 0,
        "no_stream_failures": fleet.failure is None,
    }
    every = [lag for w in measured for lag in w["lags_s"]]
    verdict = {
        "streams": args.streams,
        "rate": args.rate,
        "minutes": args.minutes,
        "warmup_s": args.warmup,
        "changes_made": churn.made,
        "changes_seen_per_s": sum(w["changes_seen"] for w in measured)
        / (measured[-1]["to_s"] - measured[0]["from_s"]),
        "lag_p50_ms": _p(every, 0.5),
        "lag_p99_ms": _p(every, 0.99),
        "p99_first_half_ms": p99_first,
        "p99_second_half_ms": p99_second,
        "rss_growth": growth,
        "lost": lost,
        "rest_failures": churn.failures,
        "first_rest_failure": churn.first_failure,
        "superseded": probe.superseded,
        "sync_refused": fleet.retries,
        "stream_failure": repr(fleet.failure) if fleet.failure else "",
        "checks": checks,
        "passed": all(checks.values()),
    }
    print(
        f"\nsoak: {verdict['changes_seen_per_s']:.1f} changes/s seen over {args.minutes:g} min "
        f"at {args.streams:,} streams; lag p50 {verdict['lag_p50_ms']:.0f} ms, p99 "
        f"{verdict['lag_p99_ms']:.0f} ms (first half {p99_first:.0f}, second half "
        f"{p99_second:.0f}: at most {LAG_GROWTH}x)\n  RSS growth after warm-up: "
        + ", ".join(f"{k} {v:+.1%}" for k, v in growth.items())
        + f" (at most {RSS_GROWTH:.0%})\n  lost {lost} (superseded before shown: "
        f"{probe.superseded}), REST failures {churn.failures}, streams refused while "
        f"syncing {fleet.retries}, stream failure {verdict['stream_failure'] or 'none'}\n  "
        + ", ".join(f"{k}: {'ok' if v else 'FAILED'}" for k, v in checks.items())
    )
    return {"windows": [{k: v for k, v in w.items() if k != "lags_s"} for w in windows]} | {
        "verdict": verdict
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="measured time (default 10)")
    parser.add_argument("--rate", type=float, default=100.0, help="changes per second (100)")
    parser.add_argument("--streams", type=int, default=1_000, help="bookbuyer ADS streams (1,000)")
    parser.add_argument(
        "--clients",
        type=int,
        default=CLIENTS,
        help=f"streams of bookbuyer, which every change reaches; the rest are bookthief's, "
        f"which bookstore's TrafficTarget leaves out ({CLIENTS})",
    )
    parser.add_argument(
        "--warmup", type=float, default=WARMUP, help=f"seconds of churn first ({WARMUP:g})"
    )
    parser.add_argument("--json", type=Path, help="write every window and the verdict here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    load.fail_fast_sniffio_import()
    with fullmesh.running("trellis-soak-") as (mesh, _):
        result = asyncio.run(soak(mesh, args))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["verdict"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
