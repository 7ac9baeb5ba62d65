"""A change, from the API that makes it until a real Envoy serves it (issue 14's lags).

The issue's targets: a VM endpoint added over REST (endpoints-vm ``POST /v1/workloads``)
until a real Envoy serves it, p50 <= 15 ms and p99 <= 50 ms, also with 1,000 other proxies
connected; a spec edit (a document written into the spec directory the catalog watches)
until Envoy serves it, p50 <= 100 ms; and the same during 100 endpoint changes per second,
at most 2x the idle figures.

Everything runs for real (:func:`bench.fullmesh.running`: Redis, certmanager,
endpoints-vm, the catalog and proxy-cp as processes, the bookstore demo with its three Envoy
sidecars). The observed Envoy is bookbuyer's sidecar (delta ADS). This process makes one
change at a time and polls that Envoy's admin API until it shows the change
(:class:`bench.envoy_admin.Poller`, every 2 ms), then waits :data:`GAP` before the next:

* **add**: ``POST /v1/workloads`` of a new bookstore-v2 workload at a new address, until
  the address is in the active load assignment of bookbuyer's bookstore-v2 cluster;
  **remove**: its ``DELETE``, until the address is gone from it. ``post`` is the POST's
  own round trip, the first hop of an add;
* **spec**: the bookstore TrafficSplit's weights changed (the file replaced, as editors
  save), until bookbuyer's route configuration has the new weights;
* **observe**, the floor of the method: a logger's level set through the same admin API
  (applied at once), until the same poll loop sees it: two admin round trips.

A figure is the time from the call (or the file's write) to the arrival of the first poll
answer that shows the change, so it is late by up to one poll interval plus one poll's round
trip (about 3 ms here): the resolution. "Served" means in the Envoy's active configuration:
no request is sent to the new endpoint (a workload at a made-up address takes no traffic).

The REST calls go over one kept-alive HTTPS connection, as a VM agent sends them
(:mod:`trellis_cli.keepalive`: its idle expiry, 60 s, outlasts the pauses between phases).
Right after the idle phase, a **fresh** phase (``fresh_``) makes the same rounds with a new
HTTPS connection for each POST and DELETE (a TCP and a TLS handshake each, as a one-shot
``trellis vm`` command pays): the baseline of the kept-alive figures, measured in the same
run (``add_p50_ms/fresh_add_p50_ms`` and the p99's, and the POSTs' alone).

Three phases, each with the same interleaved rounds (add, remove, observe; a spec edit
every few rounds): idle; with N simulated proxies connected, each its own mTLS ADS stream,
a tenth of them bookbuyer's (every bookstore change is pushed to them too), the rest
bookthief's (``@N`` on the figures); and during churn, 100 changes per second to
bookstore-v1's workloads (``churn_``), as the soak makes them. The streams and the churn
run in a process of their own (:mod:`bench.background`), so the poll loop never waits
behind them. The churn phase also reports each control-plane process's CPU time per
endpoint change (``churn_cpu_<process>_ms``).

Size: fixed work, not fixed time. ``--seconds`` 2 (the default) gives each phase 100 adds
and as many removes, and 20 spec edits; a shorter run scales both by ``(seconds / 2)²`` (at
least 10 and 3). N is 1,000 at ``--seconds`` 2 and above, ``500 * seconds`` below (at least
100), or ``TRELLIS_BENCH_PROPAGATION_STREAMS``. ``--warmup`` W runs unmeasured rounds for
W seconds before each phase.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench import envoy_admin, fullmesh, load
from bench.background import Background
from bench.report import Figure, print_table, ratio_line, results
from trellis_cli.keepalive import IDLE_EXPIRY
from trellis_testing.mesh import Mesh

CHANGES, EDITS = 100, 20  # adds (and as many removes), spec edits per phase at --seconds 2
MIN_CHANGES, MIN_EDITS = 10, 3
STREAMS = 1_000  # at --seconds 2 and above
MIN_STREAMS = 100
STREAMS_VARIABLE = "TRELLIS_BENCH_PROPAGATION_STREAMS"
RATE = 100.0  # background endpoint changes per second in the churn phase
GAP = 0.02  # seconds between a change seen and the next change made
SERVICE = "bookstore-v2"  # the measured workloads' (the churn moves bookstore-v1's)
CLUSTER = f"bookstore/{SERVICE}|"
SPLIT = "traffic-split.yaml"
SPLIT_CLUSTER = "bookstore/bookstore-v1|14001"  # the backend whose weight an edit sets
NETWORK = 201  # the measured workloads' addresses: 201.x.y.z
#: the processes whose CPU per change the churn phase reports (churn_cpu_<name>_ms)
CPU_OF = ("endpoints-vm", "catalog", "proxy-cp")
#: the fresh_ phase's figures: what a connection per call changes (no spec edits in it)
FRESH_KINDS = ("add", "remove", "post")
LOGGER = "lua"  # a logger the observed Envoy has and does not use
LEVELS = ("warning", "error")


@dataclass
class Samples:
    """Seconds per kind of change, over one phase."""

    add: list[float] = field(default_factory=list)
    remove: list[float] = field(default_factory=list)
    spec: list[float] = field(default_factory=list)
    observe: list[float] = field(default_factory=list)
    post: list[float] = field(default_factory=list)


class Observer:
    """Makes one change at a time and times it until the observed Envoy serves it."""

    def __init__(self, state_dir: Path, spec_dir: Path, admin_url: str) -> None:
        self._options = fullmesh.endpoints_vm(state_dir)
        # one kept-alive connection, as an agent keeps it (trellis_cli.keepalive)
        limits = httpx.Limits(max_keepalive_connections=1, keepalive_expiry=IDLE_EXPIRY)
        self._rest = httpx.Client(**self._options, limits=limits)
        #: a new HTTPS connection for each REST call instead (the fresh_ baseline)
        self.fresh = False
        self._poller = envoy_admin.Poller(admin_url)
        self._eds = envoy_admin.eds_path(CLUSTER)
        self._split = spec_dir / SPLIT
        self._document: dict[str, Any] = yaml.safe_load(self._split.read_text())
        self._made = 0
        self._edits = 0
        self._level = envoy_admin.logger_level(
            self._poller.fetch(envoy_admin.LOGGING_PATH, "POST"), LOGGER
        )
        if self._level is None:
            raise RuntimeError(f"the observed Envoy has no logger {LOGGER!r}")

    def round(self, samples: Samples, edit: bool) -> None:
        name, address = self._add(samples)
        time.sleep(GAP)
        samples.remove.append(self._remove(name, address))
        time.sleep(GAP)
        samples.observe.append(self._observe())
        time.sleep(GAP)
        if edit:
            samples.spec.append(self._edit())
            time.sleep(GAP)

    def _add(self, samples: Samples) -> tuple[str, str]:
        self._made += 1
        name, address = f"propagation-{self._made}", load.address(self._made, NETWORK)
        body = {
            "namespace": "bookstore",
            "name": name,
            "services": [SERVICE],
            "address": address,
            "ports": [{"name": "http", "number": 14001}],
            "service_account": "bookstore",
        }
        start = time.perf_counter()
        load.expect_status(self._call("POST", "/v1/workloads", json=body), 201)
        samples.post.append(time.perf_counter() - start)
        samples.add.append(
            self._poller.until(self._eds, lambda b: address in envoy_admin.eds_addresses(b), start)
        )
        return name, address

    def _remove(self, name: str, address: str) -> float:
        start = time.perf_counter()
        load.expect_status(self._call("DELETE", f"/v1/workloads/bookstore/{name}"), 204)
        return self._poller.until(
            self._eds, lambda b: address not in envoy_admin.eds_addresses(b), start
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """On the kept-alive connection, or (``fresh``) on a new one, closed after."""
        if not self.fresh:
            return self._rest.request(method, path, **kwargs)
        with httpx.Client(**self._options) as once:  # the same TLS context: handshakes only
            return once.request(method, path, **kwargs)

    def _observe(self) -> float:
        level = self._level = LEVELS[1] if self._level == LEVELS[0] else LEVELS[0]
        start = time.perf_counter()
        self._poller.fetch(f"{envoy_admin.LOGGING_PATH}?{LOGGER}={level}", "POST")
        return self._poller.until(
            envoy_admin.LOGGING_PATH,
            lambda b: envoy_admin.logger_level(b, LOGGER) == level,
            start,
            "POST",
        )

    def _edit(self) -> float:
        """The split's weights changed: the file replaced, as an editor saves it."""
        self._edits += 1
        weight = 50 + self._edits % 30  # never the weight before it (nor the example's 80)
        for backend in self._document["spec"]["backends"]:
            backend["weight"] = weight if backend["service"] == "bookstore-v1" else 100 - weight
        text = yaml.safe_dump(self._document, sort_keys=False)
        temporary = self._split.with_name(f".{SPLIT}.tmp")
        start = time.perf_counter()
        temporary.write_text(text)
        os.replace(temporary, self._split)
        return self._poller.until(
            envoy_admin.ROUTES_PATH,
            lambda b: envoy_admin.split_weights(b).get(SPLIT_CLUSTER) == weight,
            start,
        )

    def close(self) -> None:
        self._rest.close()
        self._poller.close()


def _phase(observer: Observer, label: str, changes: int, edits: int, warmup: float) -> Samples:
    """``warmup`` seconds of unmeasured rounds, then ``changes`` measured rounds, a spec
    edit in ``edits`` of them, spread out."""
    deadline, scratch = time.perf_counter() + warmup, Samples()
    while time.perf_counter() < deadline:
        observer.round(scratch, edit=bool(edits) and not scratch.spec)
    samples, start = Samples(), time.perf_counter()
    for index in range(changes):
        observer.round(samples, edit=index * edits // changes != (index + 1) * edits // changes)
    print(
        f"  {label}: {changes} adds and removes, {len(samples.spec)} spec edits "
        f"in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return samples


def _figures(samples: Samples, prefix: str = "", suffix: str = "") -> list[Figure]:
    def ms(values: list[float], q: float) -> float:
        return load.percentile(values, q) * 1000

    found = []
    for kind in ("add", "remove", "spec", "observe"):
        values: list[float] = getattr(samples, kind)
        if not values:
            continue
        note = f"{len(values)} changes" + ("; floor: the observation itself" * (kind == "observe"))
        for q, tag in ((0.5, "p50"), (0.99, "p99")):
            found.append(Figure(f"{prefix}{kind}_{tag}_ms{suffix}", ms(values, q), "ms", note))
    after = [add - post for add, post in zip(samples.add, samples.post, strict=True)]
    found += [
        Figure(f"{prefix}post_p50_ms{suffix}", ms(samples.post, 0.5), "ms", "an add's POST"),
        Figure(f"{prefix}after_post_p50_ms{suffix}", ms(after, 0.5), "ms", "its answer → served"),
    ]
    return found


def _report(
    phases: tuple[Samples, Samples, Samples, Samples],
    streams: int,
    rate: float,
    load_notes: list[str],
    cpu: list[Figure],
) -> dict[str, float]:
    idle, fresh, connected, churning = phases
    at = f"@{streams}"
    figures = [*_figures(idle), *_figures(connected, suffix=at), *_figures(churning, "churn_")]
    figures += [f for f in _figures(fresh, "fresh_") if f.name.split("_")[1] in FRESH_KINDS]
    figures.append(
        Figure("churn_rate", rate, "/s", f"background changes while measured ({RATE:g}/s asked)")
    )
    figures += cpu
    print_table(
        "propagation: a change until bookbuyer's Envoy serves it (admin API polled every "
        f"{envoy_admin.INTERVAL * 1000:g} ms); idle, with {streams:,} proxies connected ({at}), "
        f"during {RATE:g} endpoint changes/s (churn_)",
        figures,
    )
    for note in load_notes:
        print(f"  {note}")
    by = {f.name: f for f in figures}
    ratios = {}
    for prefix, suffix in (("", ""), ("", at), ("churn_", "")):
        floor = by[f"{prefix}observe_p50_ms{suffix}"]
        for kind in ("add", "remove", "spec"):
            subject = by.get(f"{prefix}{kind}_p50_ms{suffix}")
            if subject is not None:
                key = f"{prefix}{kind}_p50_ms/{prefix}observe_p50_ms{suffix}"
                ratios[key] = ratio_line(subject, floor)
    for kind in ("add", "remove", "spec"):
        for tag in ("p50", "p99"):
            idle_figure = by[f"{kind}_{tag}_ms"]
            ratios[f"churn_{kind}_{tag}_ms/{idle_figure.name}"] = ratio_line(
                by[f"churn_{kind}_{tag}_ms"], idle_figure, "idle figure"
            )
    print("  kept-alive connection against a fresh one per call (fresh_), same run:")
    for name in ("add_p50_ms", "add_p99_ms", "remove_p50_ms", "remove_p99_ms", "post_p50_ms"):
        ratios[f"{name}/fresh_{name}"] = ratio_line(by[name], by[f"fresh_{name}"], "baseline")
    for tag in ("p50", "p99"):  # a ratio the JSON cannot key (two sizes): printed only
        ratio_line(by[f"add_{tag}_ms{at}"], by[f"add_{tag}_ms"], "idle figure")
    return results(figures, ratios)


def _streams(seconds: float) -> int:
    configured = os.environ.get(STREAMS_VARIABLE)
    if configured:
        return int(configured)
    return max(MIN_STREAMS, round(STREAMS * min(1.0, seconds / 2)))


def run(*, seconds: float, warmup: float) -> dict[str, float]:
    load.fail_fast_sniffio_import()
    scale = (seconds / 2) ** 2  # as the endpoints benchmark: --seconds 0.5 is a quick look
    changes = max(MIN_CHANGES, round(CHANGES * scale))
    edits = max(MIN_EDITS, round(EDITS * scale))
    streams = _streams(seconds)
    started = time.perf_counter()
    notes = []
    with fullmesh.running("trellis-propagation-") as (mesh, buyer):
        observer = Observer(mesh.state_dir, mesh.spec_dir, buyer.envoy.admin)
        try:
            idle = _phase(observer, "idle", changes, edits, warmup)
            observer.fresh = True
            fresh = _phase(observer, "idle, a fresh connection per call", changes, 0, warmup)
            observer.fresh = False
            log = mesh.tmp / "background.log"
            with Background(mesh.state_dir, log, streams=streams, clients=streams // 10) as fleet:
                notes.append(
                    f"{streams:,} streams ({streams // 10:,} bookbuyer's) synced in "
                    f"{fleet.ready['sync_s']:.1f} s, {fleet.ready['refused']} refused and retried"
                )
                connected = _phase(observer, f"{streams:,} streams", changes, 0, warmup)
            with Background(mesh.state_dir, log, rate=RATE) as churn:
                before = _cpu(mesh)
                churning = _phase(observer, "churn", changes, edits, warmup)
                cpu = {name: _cpu(mesh)[name] - seconds for name, seconds in before.items()}
        finally:
            observer.close()
    for name, summary in (("streams", fleet.summary), ("churn", churn.summary)):
        if summary["rest_failures"] or summary["stream_failure"]:
            raise RuntimeError(f"the background load ({name}) failed: {summary}")
    notes.append(
        f"churn: {churn.summary['changes']:,} changes while measured; the whole run took "
        f"{time.perf_counter() - started:.0f} s"
    )
    made = churn.summary["changes"] + len(churning.add) + len(churning.remove)
    cpu_figures = [
        Figure(
            f"churn_cpu_{name.replace('-', '_')}_ms",
            seconds / made * 1000,
            "ms/change",
            f"{name}'s CPU per endpoint change while churning ({made:,} changes)",
        )
        for name, seconds in cpu.items()
    ]
    phases = (idle, fresh, connected, churning)
    return _report(phases, streams, churn.summary["rate"], notes, cpu_figures)


def _cpu(mesh: Mesh) -> dict[str, float]:
    """Each control-plane process's CPU seconds so far (user + system)."""
    found = {}
    for name in CPU_OF:
        process = mesh.processes[name].process
        seconds = load.cpu_seconds(process.pid) if process is not None else None
        if seconds is None:
            raise RuntimeError(f"{name} is not running")
        found[name] = seconds
    return found
