"""``python -m bench NAME NAME``: each benchmark in a process of its own, one report.

Run for real (the ``certs`` benchmark, the quickest, at a tenth of a second per figure),
as ``make bench`` runs it, from the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # real benchmark children: seconds each


def test_several_benchmarks_run_each_in_a_child_and_their_figures_are_merged(
    tmp_path: Path,
) -> None:
    written = tmp_path / "figures.json"
    command = [sys.executable, "-m", "bench", "certs", "certs", "--json", str(written)]
    run = subprocess.run(
        [*command, "--seconds", "0.05", "--warmup", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert run.returncode == 0, run.stderr
    assert run.stdout.count("certs: leaf issuance") == 2  # each child printed its own table
    document = json.loads(written.read_text())
    assert document["benchmarks"]["certs"]["figures"]["proxy_certs"] > 0
    [target] = [t for t in document["targets"] if t["benchmark"] == "certs"]
    assert target["measured"]
    assert target["value"] > 0


def test_a_child_that_fails_gives_no_results() -> None:
    """The parent stops the run when a child fails: here, one asked for a benchmark that
    does not exist (argparse refuses it, exit 2)."""
    probe = (
        "import sys; from bench.__main__ import _in_child; "
        "sys.exit(0 if _in_child('no-such-benchmark', 1.0, 0.0) is None else 3)"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert run.returncode == 0, (run.stdout, run.stderr)
    assert "invalid choice" in run.stderr or "unknown benchmark" in run.stderr
