"""``python -m bench xds --streams N --clients C --replicas LIST``: the layout of a big
machine, run for real at a tiny size.

20 streams (5 per connection) over 2 client processes, against the floor, one proxy-cp and
2 replicas: every server is a real grpc.aio process, every stream walks Envoy's SotW
protocol. The test checks the shape of what the run prints and returns (a summary row per
server, each figure positive, the ratios to the floor and to one proxy-cp), never how fast
anything was.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = ("p50", "p99", "cpu", "sync", "rss")
#: at this size a change may take the floor less than one of /proc's 10 ms CPU ticks, and
#: RSS growth over 10 streams is within the allocator's noise: those are only read
POSITIVE = ("p50", "p99", "sync")
NUMBER = re.compile(r"^([0-9][0-9,]*(?:\.[0-9]+)?) (ms|s|kB)(?: \((.*)\))?$")

pytestmark = pytest.mark.slow  # real server and client processes: seconds


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=os.environ | {"TRELLIS_BENCH_XDS_PER_CHANNEL": "5"},
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """The printed report and the JSON figures of one tiny run."""
    written = tmp_path_factory.mktemp("xds") / "figures.json"
    run = _bench(
        "xds",
        *("--streams", "20", "--clients", "2", "--replicas", "1,2"),
        *("--seconds", "0.1", "--warmup", "0", "--json", str(written)),
    )
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
    return run.stdout, json.loads(written.read_text())["benchmarks"]["xds"]


def _rows(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows by server label, each its cells after the label."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("xds N=20 in one table"))
    rows = {}
    for line in lines[start + 3 :]:
        if not line.startswith("|"):
            break
        label, *cells = (cell.strip() for cell in line.strip().strip("|").split("|"))
        rows[label] = cells
    return rows


def test_the_summary_has_a_row_for_the_floor_and_each_replica_count(
    tiny: tuple[str, dict[str, Any]],
) -> None:
    stdout, _ = tiny
    assert "over 2 client processes" in stdout
    rows = _rows(stdout)

    assert list(rows) == ["bare grpcio floor (one process)", "proxy-cp", "2 proxy-cp replicas"]
    for label, cells in rows.items():
        assert len(cells) == len(SUMMARY), (label, cells)
        for name, cell in zip(SUMMARY, cells, strict=True):
            found = NUMBER.match(cell)
            assert found is not None, (label, name, cell)
            value, _unit, ratios = found.groups()
            number = float(value.replace(",", ""))
            if name in POSITIVE:
                assert number > 0, (label, name, cell)
            elif name == "cpu":
                assert number >= 0, (label, name, cell)
            expected = {"bare grpcio floor (one process)": 0, "proxy-cp": 1}.get(label, 2)
            shown = ratios.split(", ") if ratios else []
            assert len(shown) == expected, (label, name, cell)  # x the floor, x one proxy-cp
            assert all(r == "-" or float(r.removesuffix("x")) >= 0 for r in shown), cell


def test_the_figures_and_ratios_are_returned_for_every_server(
    tiny: tuple[str, dict[str, Any]],
) -> None:
    _, found = tiny
    figures = found["figures"]
    ratios = {r["key"]: r for r in found["ratios"]}

    for kind in ("floor", "trellis", "replicas"):
        for name in ("p50_ms", "p99_ms", "sync_s"):
            assert figures[f"{kind}_{name}@20"] > 0, (kind, name)
        assert figures[f"{kind}_cpu_ms@20"] >= 0
        assert f"{kind}_rss_per_stream_kb@20" in figures
    assert figures["replicas_sync_refused@20"] == 0
    for kind in ("trellis", "replicas"):
        ratio = ratios[f"{kind}_p99_ms/floor_p99_ms@20"]
        assert ratio["floor_value"] == figures["floor_p99_ms@20"]
        assert ratio["ratio"] > 0
    to_one = ratios["replicas_p99_ms/trellis_p99_ms@20"]
    assert to_one["floor_value"] == figures["trellis_p99_ms@20"]
    assert to_one["ratio"] > 0
    assert "replicas_cpu_ms/trellis_cpu_ms@20" in ratios


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("xds", "--replicas", "1,0"), "--replicas"),
        (("xds", "--replicas", "two"), "--replicas"),
        (("xds", "--streams", "5"), "--streams"),
        (("xds", "--clients", "2,3"), "--clients"),
        (("certs", "--clients", "2"), "--clients"),
    ],
)
def test_a_bad_layout_is_refused_naming_the_option(args: tuple[str, ...], named: str) -> None:
    run = _bench(*args)

    assert run.returncode == 2, run.stdout
    assert named in run.stderr.splitlines()[-1], run.stderr
    assert "Traceback" not in run.stderr
