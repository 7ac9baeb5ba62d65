"""``python -m bench startup``: every service and ``trellis up`` started for real, timed.

As ``make bench`` runs it, from the repository; ``trellis up`` binds the default ports, so
the test shares an xdist group with the other tests that do (it never runs beside them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.loader import run_bench

SERVICES = ("certmanager", "endpoints-vm", "catalog", "proxy-cp", "injector")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fixed-ports"), pytest.mark.timeout(300)]


def test_each_service_and_trellis_up_is_timed_against_bare_python(tmp_path: Path) -> None:
    written = tmp_path / "figures.json"
    run = run_bench("startup", "--seconds", "0.5", "--json", str(written), timeout=280)

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    document = json.loads(written.read_text())
    found = document["benchmarks"]["startup"]
    floor = found["figures"]["python_pass_s"]
    assert 0 < floor < found["figures"]["cli_help_s"]
    for name in SERVICES:  # a service does more than bare Python does
        assert found["figures"][f"{name}_ready_s"] > floor
    # `trellis up` starts them all (and Redis): more than bare Python, whatever the load (the
    # services' own figures are measured apart, so a loaded machine may order them either way)
    assert found["figures"]["up_s"] > floor
    ratios = {r["key"]: r for r in found["ratios"]}
    assert ratios["up_s/python_pass_s"]["floor_value"] == floor
    targets = [t for t in document["targets"] if t["benchmark"] == "startup"]
    assert {t["key"] for t in targets} == {*(f"{n}_ready_s" for n in SERVICES), "up_s"}
    assert all(t["measured"] and isinstance(t["met"], bool) for t in targets)
