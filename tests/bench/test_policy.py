"""``python -m bench policy``: a routes change and a rotation through the real control
plane, each against the whole build it cost before, from the repository as ``make bench``
runs it."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.loader import run_bench


def test_each_change_is_measured_against_a_whole_build(tmp_path: Path) -> None:
    written = tmp_path / "figures.json"
    run = run_bench(
        "policy", "--seconds", "0.05", "--warmup", "0", "--json", str(written), timeout=120
    )

    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "kinds translated over the run: clusters" in run.stdout
    found = json.loads(written.read_text())["benchmarks"]["policy"]
    for name in ("routes_change", "whole_routes_change", "rotation", "whole_rotation"):
        assert found["figures"][name] > 0, name
    ratios = {r["key"]: r for r in found["ratios"]}
    for name in ("routes_change", "rotation"):
        ratio = ratios[f"{name}/whole_{name}"]
        assert (ratio["value"], ratio["floor_value"]) == (
            found["figures"][name],
            found["figures"][f"whole_{name}"],
        )
        assert ratio["ratio"] == ratio["value"] / ratio["floor_value"]
