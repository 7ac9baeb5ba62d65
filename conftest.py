"""Root conftest: fixtures every package's tests share (a real Redis, its client), and the
fuzz budgets.

The fuzz suite (every ``test_fuzz_*.py``: hypothesis, and schemathesis, which runs on
hypothesis) takes its budget from one hypothesis profile, chosen by ``TRELLIS_FUZZ_PROFILE``:

- ``ci`` (the default, so ``make test`` and CI): 100 examples per test and no example
  database; the whole suite (96 tests) takes about 35 s on our two-core machine;
- ``fuzz`` (``make fuzz``): 5,000 examples per test, with the example database in
  ``.hypothesis/`` so a failure found once is replayed first next time.

Both turn the per-example deadline off: on a shared two-core machine timing is noise, and a
hang is caught by pytest-timeout instead.
"""

import os
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# gRPC's C core logs connection events at info level to stderr; tests want errors only.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

pytest_plugins = ["trellis_testing.fixtures"]

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile(
    "fuzz",
    max_examples=5_000,
    deadline=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.load_profile(os.environ.get("TRELLIS_FUZZ_PROFILE", "ci"))


ROOT = Path(__file__).resolve().parent

#: Folders whose tests get a kind marker other than ``unit`` (see :func:`kind_of`).
FOLDER_KINDS = {("tests", "integration"): "integration", ("tests", "netns"): "netns"}
#: Every kind of test, each a marker (``-m unit``, ``-m "not slow"``...).
KINDS = ("unit", "integration", "fuzz", "slow", "netns")


def kind_of(item: pytest.Item) -> str:
    """``integration`` (several real processes), ``netns`` (pods made of network namespaces,
    root only) or ``unit`` (one process, maybe with a real Redis or Envoy beside it), by the
    test's folder, or by a marker the module sets itself."""
    try:
        parts = item.path.relative_to(ROOT).parts
    except ValueError:
        parts = ()
    for folder, kind in FOLDER_KINDS.items():
        if parts[: len(folder)] == folder:
            return kind
    for kind in ("integration", "netns"):
        if item.get_closest_marker(kind) is not None:
            return kind
    return "unit"


def pytest_report_header() -> str:
    """Which path runs the tests' Redis (a container, or the local binary)."""
    from trellis_testing import redis_backend  # after the plugins

    return redis_backend.describe()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its kind, and the fuzz suite ``fuzz``; then order the tests so the
    long ones start first: under xdist the workers then finish together, instead of one
    running the last integration test alone while the other waits."""
    for item in items:
        item.add_marker(kind_of(item))
        if item.path.name.startswith("test_fuzz_"):
            item.add_marker("fuzz")
    order = {"integration": 0, "netns": 1, "unit": 2}
    items.sort(key=lambda item: order[kind_of(item)])  # stable: files keep their order


@pytest.hookimpl(trylast=True)  # after xdist wrote the groups into the node ids
def pytest_collection_finish(session: pytest.Session) -> None:
    """Refuse a run that would silently lose tests under xdist, which schedules by node id:
    two tests with one node id run once (pytest 9.2 gave schemathesis' cases their
    function's id), and a group that did not reach the node id is no group (pytest 9.2's
    structured ids drop what xdist 3.8 writes: xdist issue 1386)."""
    items = session.items
    twice = [nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1]
    if twice:
        raise pytest.UsageError(f"{len(twice)} node ids name several tests: {twice[:5]}")
    worker = "PYTEST_XDIST_WORKER" in os.environ
    if worker and session.config.getoption("loadgroup", False):  # what xdist's workers read
        lost = [
            item.nodeid
            for item in items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
        ]
        if lost:
            raise pytest.UsageError(f"xdist groups were not applied to {lost[:5]}")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With ``TRELLIS_TEST_TIMELINE=<dir>``, each worker writes one line per test phase
    (worker, node id, phase, start and stop as epoch seconds) to ``<dir>/<worker>.jsonl``:
    what ``tools/timeline.py`` reads to show where a run's wall time went."""
    folder = os.environ.get("TRELLIS_TEST_TIMELINE")
    if not folder or hasattr(report, "node"):  # xdist's controller: its worker wrote it
        return
    import json

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    line = {"worker": worker, "nodeid": report.nodeid, "when": report.when,
            "start": report.start, "stop": report.stop}  # fmt: skip
    Path(folder).mkdir(parents=True, exist_ok=True)
    with (Path(folder) / f"{worker}.jsonl").open("a") as out:
        out.write(json.dumps(line) + "\n")
