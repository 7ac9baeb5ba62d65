"""The catalog's recompute cost: every view from scratch, and one endpoint change.

The requirement: 1,000 services, 10,000 endpoints, 2,000 policies; print the time to build
every view from scratch and the time to apply one endpoint change (median, p99), and how
both grow from 100 to 1,000 services. So for each size N in :data:`SIZES` this generates
the synthetic mesh of :mod:`bench.mesh` (N services, 10 endpoints and 2 policies each, one
expected proxy each), parses its documents through the real ``KindRegistry`` (timed on its
own: ``parse_ms``), and drives :class:`~trellis_catalog.catalog.Catalog` in process,
calling ``flush()`` directly (no debounce, no announce):

* ``build_ms``: a new Catalog, ``set_documents``, ``set_provider_services``,
  ``expect_proxy`` for every proxy, then ``flush()``: every view from scratch (median of up
  to :data:`MAX_REPEATS`, repeated while under ``--seconds``);
* ``service_build_ms``: the same build as the service runs it (interleaved with the
  above): no full (generation 2) collection during the flush, as
  :meth:`~trellis_catalog.catalog.Catalog.flush_in_steps` pauses them, and the young
  collection the service does before freezing what the flush built, included;
* ``change_median_ms``/``change_p99_ms``: on that catalog, ``update_provider_service`` for
  one random service with one endpoint moved to a new address, then ``flush()``; up to
  :data:`CHANGES` changes (in proportion fewer for ``--seconds`` below 2), and fewer when
  they take more than ``CHANGE_BUDGET * --seconds``
  (with fewer than 100 changes p99 is the slowest one). ``change_resources`` is the
  median number of resources (policies, slices, destinations) the flush published, and
  its note the most policies one such change moved (an endpoint moves none);
* ``policy_change_ms``: one TrafficTarget's sources replaced (the new document parsed
  beforehand), ``set_documents`` with the edited list, ``flush()``; median like builds.

Floors, measured in the same run and interleaved with their subjects:

* ``index_floor_ms``: ``services.index`` of the declared Services and every report, and
  ``services.cluster`` for every port: the part of a build that is linear in the mesh
  (:data:`FLOOR_REPEATS` times before each build; median);
* ``cluster_floor_ms``: ``services.cluster`` for the changed service's ports: the least an
  endpoint change must redo.

Times are CPU seconds of this process (``time.process_time``), not wall time: the work
is single-threaded, in process and without I/O, so on an idle machine both are the same,
but the sizes are measured minutes apart and on a shared machine other processes would
otherwise change the growth table more than the catalog does. Each size prints the share
of a core the process had; well below 100% means the machine was busy.

The growth table divides each figure at N by the one at the first size, next to how much
N grew, and fits the exponent k of N**k between the first and the last size (k near 1 is
linear, near 2 quadratic), and again between the last two sizes (``*_exponent_top``: the
top of the range, where fixed costs no longer hide the growth). ``--seconds`` below
:data:`QUICK_SECONDS` keeps the first :data:`QUICK_SIZES` sizes (no 1,000 and 5,000);
``TRELLIS_BENCH_CATALOG_SIZES=100,250`` picks sizes. ``--warmup`` seconds of unmeasured
builds (first size only) and of endpoint changes (every size) run first.

``stall_ms``: the same full build as the service meets it, on an event loop (see
:func:`_worst_stall`): the longest the loop was held, against the issue's 50 ms.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from bench import load, mesh, report
from trellis_catalog import sources
from trellis_catalog.catalog import Catalog
from trellis_catalog.domain.index import services as svc
from trellis_common.documents.base import Document, KindRegistry, Origin
from trellis_common.model import MeshService
from trellis_spec import mesh as meshspec
from trellis_spec.steps import full_collections_paused

SIZES = (100, 250, 500, 1_000, 5_000)
QUICK_SIZES = 3  # the first three
MIN_SIZE = 10  # a TrafficTarget needs other accounts to allow
QUICK_SECONDS = 1.0  # --seconds below this skips the largest size
MAX_REPEATS = 5  # builds and policy changes per size, while under --seconds
FLOOR_REPEATS = 5  # index floors before each build
CHANGES = 200  # endpoint changes per size at --seconds FULL_SECONDS, at most; fewer below
FULL_SECONDS = 2.0
MIN_CHANGES = 20
CHANGE_BUDGET = 5.0  # endpoint changes per size stop after this many times --seconds
TRUST_DOMAIN = "cluster.local"
ORIGIN = "bench/mesh.yaml"
MOVED_FROM = 1 << 23  # moved endpoints get addresses from 10.128.0.0 on
STALL_PROBE = 0.001  # seconds the loop probe sleeps between two looks
CLOCK = time.process_time  # CPU seconds of this process: see the module's docstring
BUSY_BELOW = 0.9  # a smaller share of a core means other processes were busy


@dataclass
class Measured:
    """What one size measured: durations in seconds, one per repetition."""

    mesh: mesh.Mesh
    parse: float
    wall: float = 0.0  # the whole size, generation included: wall and CPU seconds
    cpu: float = 0.0
    builds: list[float] = field(default_factory=list)
    service_builds: list[float] = field(default_factory=list)  # full collections paused
    index_floor: list[float] = field(default_factory=list)
    changes: list[float] = field(default_factory=list)
    cluster_floor: list[float] = field(default_factory=list)
    touched: list[int] = field(default_factory=list)
    touched_policies: list[int] = field(default_factory=list)
    policy_changes: list[float] = field(default_factory=list)
    policy_touched: list[int] = field(default_factory=list)
    stall: float = 0.0  # the event loop's worst stall over a full build, in steps


def run(*, seconds: float = 2.0, warmup: float = 0.2) -> dict[str, float]:
    started = time.perf_counter()
    registry = sources.kinds()
    results: dict[str, float] = {}
    everything: list[Measured] = []
    for position, size in enumerate(sizes(seconds)):
        wall, cpu = time.perf_counter(), time.process_time()
        measured = _measure(size, registry, seconds, warmup if position == 0 else 0.0, warmup)
        measured.wall = time.perf_counter() - wall
        measured.cpu = time.process_time() - cpu
        everything.append(measured)
        results |= _report(measured)
    results |= _growth(everything)
    print(f"  (the whole run took {time.perf_counter() - started:.1f} s)")
    return results


def sizes(seconds: float, env: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    text = env.get("TRELLIS_BENCH_CATALOG_SIZES", "").strip()
    if text:
        chosen = tuple(int(part) for part in text.split(","))
        if any(n < MIN_SIZE for n in chosen):
            reason = f"must be numbers >= {MIN_SIZE}, separated by commas"
            raise ValueError(f"TRELLIS_BENCH_CATALOG_SIZES {reason}, got {text!r}")
        return chosen
    return SIZES if seconds >= QUICK_SECONDS else SIZES[:QUICK_SIZES]


def _measure(
    size: int, registry: KindRegistry, seconds: float, build_warmup: float, warmup: float
) -> Measured:
    synthetic = mesh.generate(size)
    start = CLOCK()
    documents = _parse(registry, synthetic.documents)
    measured = Measured(synthetic, CLOCK() - start)
    declared = meshspec.build(documents).services

    def build() -> Catalog:
        catalog = Catalog(trust_domain=TRUST_DOMAIN)
        catalog.set_documents(documents, [])
        catalog.set_provider_services(mesh.PROVIDER, synthetic.reports)
        for proxy in synthetic.proxies:
            catalog.expect_proxy(proxy.common_name, proxy.service_account)
        catalog.flush()
        return catalog

    def index_floor() -> None:
        known = svc.index(declared, synthetic.reports)
        for k in known.values():
            for port in k.ports:
                svc.cluster(k, port, TRUST_DOMAIN)

    _repeat_for(build, build_warmup)
    catalog: Catalog | None = None
    while catalog is None or (
        len(measured.builds) < MAX_REPEATS and sum(measured.builds) < seconds
    ):
        for _ in range(FLOOR_REPEATS):  # cheap: a few, so one GC pause is not the median
            start = CLOCK()
            index_floor()
            measured.index_floor.append(CLOCK() - start)
        start = CLOCK()
        catalog = build()
        measured.builds.append(CLOCK() - start)
        if len(measured.builds) == 1:
            _check(catalog, synthetic)
        catalog = None  # its garbage is not the next build's
        start = CLOCK()
        with full_collections_paused():  # as flush_in_steps runs it in the service
            catalog = build()
        gc.collect(1)  # the service's, before it freezes what the flush built
        measured.service_builds.append(CLOCK() - start)
    measured.stall = _worst_stall(documents, synthetic)
    # the endpoint and policy changes run against the last catalog built

    changer = _EndpointChanger(catalog, synthetic, random.Random(mesh.SEED + size))
    _repeat_for(changer.change, warmup)
    budget = CHANGE_BUDGET * seconds
    wanted = max(MIN_CHANGES, round(CHANGES * min(1.0, seconds / FULL_SECONDS)))
    while len(measured.changes) < wanted and (
        len(measured.changes) < MIN_CHANGES or sum(measured.changes) < budget
    ):
        elapsed, touched, policies, floor = changer.change()
        measured.touched_policies.append(policies)
        measured.changes.append(elapsed)
        measured.touched.append(touched)
        measured.cluster_floor.append(floor)

    editor = _PolicyEditor(catalog, registry, synthetic, documents, random.Random(mesh.SEED - size))
    while len(measured.policy_changes) < MAX_REPEATS and sum(measured.policy_changes) < seconds:
        elapsed, touched = editor.edit()
        measured.policy_changes.append(elapsed)
        measured.policy_touched.append(touched)
    return measured


def _worst_stall(documents: Sequence[Document], synthetic: mesh.Mesh) -> float:
    """A full build as the service meets it, on an event loop: the documents in one call
    (the spec source's), the provider's full list in one, each proxy's onboarding in one,
    then :meth:`Catalog.flush_in_steps`. A probe task asks for a 1 ms sleep, over and over;
    the worst lateness of its wake-ups is the longest the loop was held (seconds)."""

    async def build() -> float:
        worst, done = 0.0, False

        async def probe() -> None:
            nonlocal worst
            while not done:
                asked = time.perf_counter()
                await asyncio.sleep(STALL_PROBE)
                worst = max(worst, time.perf_counter() - asked - STALL_PROBE)

        # as in the service after its first flush (Catalog.flush_in_steps freezes what
        # survives a flush): what exists already is out of the collector's sight
        gc.freeze()
        prober = asyncio.create_task(probe())
        await asyncio.sleep(STALL_PROBE * 5)
        catalog = Catalog(trust_domain=TRUST_DOMAIN, freeze_heap=True)
        catalog.set_documents(documents, [])
        await asyncio.sleep(0)
        catalog.set_provider_services(mesh.PROVIDER, synthetic.reports)
        for proxy in synthetic.proxies:
            await asyncio.sleep(0)
            catalog.expect_proxy(proxy.common_name, proxy.service_account)
        await catalog.flush_in_steps()
        if len(catalog.policies) != len(synthetic.proxies):
            raise RuntimeError(f"{len(catalog.policies)} policies after the stepped build")
        done = True
        await prober
        return worst

    try:
        return asyncio.run(build())
    finally:
        gc.unfreeze()


def _parse(registry: KindRegistry, raws: Sequence[mesh.Raw]) -> list[Document]:
    return [registry.parse(raw, Origin(ORIGIN, i)) for i, raw in enumerate(raws)]


def _repeat_for(op: Callable[[], object], seconds: float) -> None:
    """Unmeasured warm-up: ``op`` until ``seconds`` passed, at least once if ``seconds``."""
    deadline = time.perf_counter() + seconds
    while seconds > 0 and time.perf_counter() < deadline:
        op()


def _check(catalog: Catalog, synthetic: mesh.Mesh) -> None:
    """Make sure the build measures the mesh meant: every document valid, every view built."""
    bad = [s for s in catalog.spec.statuses.values() if s.state != "valid"]
    if bad:
        raise RuntimeError(f"the synthetic mesh has invalid documents, e.g. {bad[0]}")
    views = catalog.view_versions()
    if len(catalog.policies) != synthetic.services or len(views) != synthetic.services:
        raise RuntimeError(f"expected {synthetic.services} views, got {len(views)}")
    if len(catalog.clusters) != synthetic.services:
        raise RuntimeError(f"expected {synthetic.services} clusters, got {len(catalog.clusters)}")


class _EndpointChanger:
    """Moves one endpoint of one random service per :meth:`change`, and flushes."""

    def __init__(self, catalog: Catalog, synthetic: mesh.Mesh, rng: random.Random) -> None:
        self.catalog = catalog
        self.reports = list(synthetic.reports)
        self.rng = rng
        self.next_address = MOVED_FROM

    def change(self) -> tuple[float, int, int, float]:
        """One change: (seconds to apply it, resources published, of them policies, seconds
        of the floor)."""
        index = self.rng.randrange(len(self.reports))
        report_ = mesh.moved(
            self.reports[index], self.rng.randrange(mesh.ENDPOINTS_PER_SERVICE), self.next_address
        )
        self.reports[index] = report_
        self.next_address += 1
        catalog = self.catalog
        start = CLOCK()
        catalog.update_provider_service(mesh.PROVIDER, report_.namespace, report_.name, report_)
        batch = catalog.flush()
        elapsed = CLOCK() - start
        known = catalog.services[MeshService(report_.namespace, report_.name)]
        if mesh.address(self.next_address - 1) not in {e.address for e in known.endpoints}:
            raise RuntimeError(f"the change to {report_.service} did not reach the catalog")
        start = CLOCK()
        for port in known.ports:
            svc.cluster(known, port, TRUST_DOMAIN)
        floor = CLOCK() - start
        published = batch.changes if batch else ()
        policies = sum(1 for name, _ in published if name.startswith("policy/"))
        return elapsed, len(published), policies, floor


class _PolicyEditor:
    """Replaces one random TrafficTarget's sources per :meth:`edit`, and flushes."""

    def __init__(
        self,
        catalog: Catalog,
        registry: KindRegistry,
        synthetic: mesh.Mesh,
        documents: list[Document],
        rng: random.Random,
    ) -> None:
        self.catalog = catalog
        self.registry = registry
        self.raws = synthetic.documents  # documents[i] was parsed from raws[i]
        self.documents = list(documents)
        self.rng = rng
        self.targets = [i for i, d in enumerate(documents) if d.key.kind == "TrafficTarget"]
        self.accounts = [
            (d.key.namespace, d.key.name) for d in documents if d.key.kind == "ServiceAccount"
        ]

    def edit(self) -> tuple[float, int]:
        index = self.rng.choice(self.targets)
        sources = self.rng.sample(self.accounts, self.rng.randint(*mesh.SOURCES))
        edited = mesh.edited_target(self.raws[index], sources)
        self.documents[index] = self.registry.parse(edited, self.documents[index].origin)
        start = CLOCK()
        self.catalog.set_documents(self.documents, [])
        batch = self.catalog.flush()
        return CLOCK() - start, len(batch.changes) if batch else 0


def _ms(values: Sequence[float], q: float = 0.5) -> float:
    return load.percentile(values, q) * 1000


def _report(m: Measured) -> dict[str, float]:
    n = m.mesh.services
    builds, changes, edits = len(m.builds), len(m.changes), len(m.policy_changes)
    build = report.Figure(
        "build_ms",
        _ms(m.builds),
        "ms",
        f"new Catalog, set every input, flush(): median of {builds}",
    )
    service_build = report.Figure(
        "service_build_ms",
        _ms(m.service_builds),
        "ms",
        "the same as the service runs it: no full collection during a flush (then gen 1)",
    )
    index_floor = report.Figure(
        "index_floor_ms",
        _ms(m.index_floor),
        "ms",
        "floor: services.index + services.cluster for every port",
    )
    change = report.Figure(
        "change_median_ms",
        _ms(m.changes),
        "ms",
        f"update_provider_service (1 endpoint moved) + flush(): {changes} changes",
    )
    p99 = report.Figure("change_p99_ms", _ms(m.changes, 0.99), "ms", "the same, p99")
    cluster_floor = report.Figure(
        "cluster_floor_ms",
        _ms(m.cluster_floor),
        "ms",
        "floor: services.cluster for the changed service, median",
    )
    figures = [
        report.Figure(
            "parse_ms",
            m.parse * 1000,
            "ms",
            f"KindRegistry.parse of {len(m.mesh.documents):,} documents",
        ),
        build,
        service_build,
        index_floor,
        change,
        p99,
        cluster_floor,
        report.Figure(
            "change_resources",
            statistics.median(m.touched),
            "resources",
            f"published per endpoint change, median (max {max(m.touched)}; "
            f"policies moved: max {max(m.touched_policies)})",
        ),
        report.Figure(
            "policy_change_ms",
            _ms(m.policy_changes),
            "ms",
            f"1 TrafficTarget's sources edited, set_documents + flush(): median of {edits}",
        ),
        report.Figure(
            "stall_ms",
            m.stall * 1000,
            "ms",
            "event loop's worst stall over a full build: inputs, then flush_in_steps (wall)",
        ),
        report.Figure(
            "policy_resources",
            statistics.median(m.policy_touched),
            "resources",
            "published per policy change, median",
        ),
    ]
    report.print_table(f"catalog N={n:,}: {m.mesh.describe()}", figures)
    share = m.cpu / m.wall if m.wall else 1.0
    busy = "; other processes competed for the rest" if share < BUSY_BELOW else ""
    print(
        f"  (times are CPU time of this process; N={n:,} took {m.wall:.1f} s, and the "
        f"process had {share:.0%} of a core{busy})"
    )
    ratios = {
        f"build_ms/index_floor_ms@{n}": report.ratio_line(build, index_floor),
        f"service_build_ms/index_floor_ms@{n}": report.ratio_line(service_build, index_floor),
        f"change_median_ms/cluster_floor_ms@{n}": report.ratio_line(change, cluster_floor),
    }
    print()
    return {f"{f.name}@{n}": f.value for f in figures} | ratios


def _growth(everything: Sequence[Measured]) -> dict[str, float]:
    """The growth table: each figure at N over the same at the first size, and N**k fits."""
    columns: dict[str, Callable[[Measured], float]] = {
        "build_ms": lambda m: _ms(m.builds),
        "service_build_ms": lambda m: _ms(m.service_builds),
        "index_floor_ms": lambda m: _ms(m.index_floor),
        "change_median_ms": lambda m: _ms(m.changes),
        "policy_change_ms": lambda m: _ms(m.policy_changes),
    }
    series = {name: [value(m) for m in everything] for name, value in columns.items()}
    return report.growth("catalog", [m.mesh.services for m in everything], series)
