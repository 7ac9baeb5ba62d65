"""``python -m bench --json``: the document a machine reads, from a run's results."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bench.loader import bench_module

figures = bench_module("figures")

RESULTS = {
    "certs": {
        "proxy_certs": 900.0,
        "raw_sign": 3000.0,
        "proxy_certs/raw_sign": 0.3,
    },
    "xds": {
        "trellis_p99_ms@5000": 1200.0,
        "floor_p99_ms@5000": 1000.0,
        "trellis_p99_ms/floor_p99_ms@5000": 1.2,
    },
}


def test_each_ratio_names_its_floor_and_each_target_says_whether_it_is_met(
    tmp_path: Path,
) -> None:
    path = tmp_path / "figures.json"
    figures.write(path, RESULTS, seconds=2.0, warmup=0.2)
    document = json.loads(path.read_text())
    [ratio] = document["benchmarks"]["xds"]["ratios"]
    assert ratio == {
        "key": "trellis_p99_ms/floor_p99_ms@5000",
        "ratio": 1.2,
        "figure": "trellis_p99_ms@5000",
        "value": 1200.0,
        "floor": "floor_p99_ms@5000",
        "floor_value": 1000.0,
    }
    assert document["benchmarks"]["certs"]["figures"] == {"proxy_certs": 900.0, "raw_sign": 3000.0}
    targets = {t["key"]: t for t in document["targets"]}
    assert targets["trellis_p99_ms@5000"]["met"] is False  # 1.2 s over the 1 s target
    assert targets["proxy_certs/raw_sign"]["met"] is True  # exactly the 0.30x target
    assert targets["service_build_ms@1000"] == {
        "benchmark": "catalog",
        "key": "service_build_ms@1000",
        "what": "full build, 1,000 services, as the service runs it",
        "target": "<= 300",
        "measured": False,  # not run: never reported as met
    }
    assert document["run"] == {"seconds": 2.0, "warmup": 0.2}


def test_a_ratio_to_an_idle_figure_names_it_as_its_floor(tmp_path: Path) -> None:
    results = {
        "propagation": {
            "add_p50_ms": 20.0,
            "churn_add_p50_ms": 30.0,
            "churn_add_p50_ms/add_p50_ms": 1.5,
        }
    }
    path = tmp_path / "figures.json"
    figures.write(path, results, seconds=0.5, warmup=0.0)
    document = json.loads(path.read_text())
    [ratio] = document["benchmarks"]["propagation"]["ratios"]
    assert (ratio["figure"], ratio["value"]) == ("churn_add_p50_ms", 30.0)
    assert (ratio["floor"], ratio["floor_value"]) == ("add_p50_ms", 20.0)
    targets = {t["key"]: t for t in document["targets"]}
    assert targets["churn_add_p50_ms/add_p50_ms"]["met"] is True  # 1.5x, at most 2x
    assert targets["add_p50_ms"]["met"] is False  # 20 ms over 15 ms
    assert targets["add_p50_ms@1000"]["measured"] is False  # a smaller fleet, or none
