"""The Grafana dashboards in deploy/grafana are generated, well formed, and every metric
their queries name is one a running mesh really exports: the sidecars' Envoy statistics
(scraped from their stats port, as Prometheus does through the pods' annotations) and the
control plane's own /metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from trellis_testing.mesh import BOOKSTORE, Mesh
from trellis_testing.ports import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count", "_created")


def test_the_dashboards_are_generated_from_tools_dashboards() -> None:
    checked = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "dashboards.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    assert sorted(p.name for p in GRAFANA.glob("*.json")) == [
        "control-plane.json",
        "mesh-overview.json",
        "service.json",
    ]


def queries() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(GRAFANA.glob("*.json")):
        model = json.loads(path.read_text())
        assert model["uid"].startswith("trellis-")
        assert {v["name"] for v in model["templating"]["list"]} >= {"datasource"}
        for panel in model["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"], panel["title"]
            found.setdefault(path.name, []).extend(t["expr"] for t in panel["targets"])
    return found


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression reads (not its label names)."""
    bare = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    bare = re.sub(r"\bby \([^)]*\)", "", bare)  # grouping labels
    return {
        t for t in re.findall(r"[a-z_][a-z0-9_]*", bare) if t.startswith(("envoy_", "trellis_"))
    }


def exported(text: str) -> set[str]:
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            base = line.split()[2]
            names.update(base + suffix for suffix in SUFFIXES)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_every_metric_a_dashboard_reads_is_exported_by_a_running_mesh(mesh: Mesh) -> None:
    stats = {name: free_port() for name in ("v1", "buyer")}
    v1 = mesh.onboard(
        "bookstore-v1", "bookstore", "bookstore-v1", "bookstore",
        app_port=mesh.app("v1").port, stats_port=stats["v1"],
    )  # fmt: skip
    mesh.register("v1-a", "bookstore-v1", v1.inbound_port)
    buyer = mesh.onboard(
        "bookbuyer", "bookbuyer", "bookbuyer", "bookbuyer", stats_port=stats["buyer"]
    )
    for sidecar in (v1, buyer):
        sidecar.envoy.wait_ready()
    for _ in range(50):  # until traffic flows, so every per-request statistic exists
        if buyer.get(BOOKSTORE, "/books-bought").status_code == 200:
            break
    names: set[str] = set()
    for port in stats.values():
        names |= exported(httpx.get(f"http://127.0.0.1:{port}/stats/prometheus", timeout=5).text)
    for service in ("certmanager", "catalog", "proxy-cp"):
        names |= exported(mesh.processes[service].get("/metrics").text)
    for dashboard, exprs in queries().items():
        for expr in exprs:
            missing = metric_names(expr) - names
            assert not missing, (
                f"{dashboard}: {expr} reads {sorted(missing)}, which nothing exports"
            )
