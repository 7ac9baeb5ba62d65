"""``trellis dashboard --prometheus-url``: the sidecars' traffic from Prometheus.

End to end with a real Prometheus (Debian's ``prometheus`` package) scraping a real Envoy's
``/stats/prometheus``: the CLI's page data shows the edges, their rates, the denials and
mTLS. The pure step from query results to edges is checked on vectors shaped as Prometheus
answers them, with the series names and values a real Envoy exposed for the same traffic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from trellis_cli import dashprom
from trellis_cli.main import cli
from trellis_cli.meshedges import DENIED
from trellis_testing.ports import free_port
from trellis_testing.waiting import eventually

PROMETHEUS = shutil.which("prometheus")
WEB = "shop/web|8080"  # the conftest sidecar's clusters


def _series(value: float | str, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [1700000000.0, str(value)]}


def _results(**by_key: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    keys = dashprom.queries("1m")
    return {key: by_key.get(key.replace(":", "_"), []) for key in keys}


def test_query_results_become_edges_summed_over_an_identitys_sidecars() -> None:
    # two sidecars of shop/client (as Envoy names them), each sent 10 requests to shop/web
    # in the window, and one no-route request each; one of the pods also saw 403s
    pods = [
        {"namespace": "shop", "app": "client", "pod": p, "instance": f"10.0.0.{i}:15010"}
        for i, p in ((1, "client-a"), (2, "client-b"))
    ]
    web = {"envoy_cluster_name": WEB}
    results = _results(
        total_upstream_rq_total=[_series(40, **p, **web) for p in pods],
        moved_upstream_rq_total=[_series(10, **p, **web) for p in pods],
        moved_upstream_rq_completed=[_series(10, **p, **web) for p in pods],
        moved_upstream_rq_403=[_series(5, **pods[0], **web, envoy_response_code="403")],
        total_no_route=[_series(4, **p, envoy_http_conn_manager_prefix="outbound") for p in pods],
        moved_no_route=[_series(1, **p, envoy_http_conn_manager_prefix="outbound") for p in pods],
        latency_p50=[_series(2.0, **pods[0], **web), _series("NaN", **pods[1], **web)],
        latency_p99=[_series(9.5, **p, **web) for p in pods],
        tls=[_series(3, **p, **web) for p in pods],
    )
    reading = dashprom.assemble(results, 60.0)
    assert reading.errors == []
    assert reading.source == {"kind": "prometheus", "sidecars": 2, "unlabelled": 0}
    assert [s.identity for s in reading.samples] == ["shop/client", "shop/client"]
    assert reading.edges is not None
    edges = {(e.source, e.destination): e.as_json() for e in reading.edges}
    assert set(edges) == {("shop/client", "shop/web"), ("shop/client", DENIED)}
    served = edges[("shop/client", "shop/web")]
    assert served["requests"] == 80
    assert served["rps"] == pytest.approx(20 / 60)
    assert served["success_rate"] == pytest.approx(15 / 20)  # 5 of 20 refused (403)
    assert served["denied_rps"] == pytest.approx(5 / 60)
    assert served["p50_ms"] == 2.0  # NaN (no request in the window) is no figure
    assert served["p99_ms"] == 9.5
    assert served["mtls"] is True
    denied = edges[("shop/client", DENIED)]
    assert denied["requests"] == 8
    assert denied["denied_rps"] == pytest.approx(2 / 60)
    assert denied["success_rate"] == 0.0


def test_a_sidecar_without_namespace_and_service_labels_is_named_and_reported() -> None:
    results = _results(
        total_upstream_rq_total=[_series(3, instance="10.0.0.9:15010", envoy_cluster_name=WEB)]
    )
    reading = dashprom.assemble(results, 60.0)
    assert [s.identity for s in reading.samples] == ["10.0.0.9:15010"]
    assert reading.source["unlabelled"] == 1
    [error] = reading.errors
    assert "1 sidecar(s) have no namespace and service labels" in error
    assert reading.edges is not None
    [edge] = reading.edges
    assert (edge.source, edge.rps, edge.tls) == ("10.0.0.9:15010", None, "plaintext")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prometheus-url", "prom:9090"], "'prom:9090' is not an http:// URL"),
        (["--prometheus-url", "http://p", "--prometheus-window", "5 min"], "'5 min' is not a"),
        (["--prometheus-url", "http://p", "--sidecar", "http://s"], "--sidecar and --prometheus"),
    ],
)
def test_bad_prometheus_options_are_refused_by_name(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = CliRunner().invoke(cli, ["--state-dir", str(tmp_path), "dashboard", "--no-open", *args])
    assert done.exit_code == 2, done.output
    assert message in done.output


@pytest.mark.slow
def test_what_is_not_prometheus_is_an_error_and_the_last_answer_stays(sidecar: Any) -> None:
    not_prometheus = dashprom.PrometheusSource(sidecar.envoy.admin)  # Envoy's admin: 404
    reading = not_prometheus.read()
    [error] = reading.errors
    assert error.startswith(f"prometheus: {sidecar.envoy.admin} answered 404")
    closed = dashprom.PrometheusSource(f"http://127.0.0.1:{free_port()}")
    [error] = closed.read().errors
    assert "is not reachable: ConnectError" in error
    assert error.endswith("(showing the last answer)")


@pytest.fixture
def prometheus(tmp_path: Path, sidecar: Any) -> Iterator[str]:
    """A real Prometheus scraping the sidecar every second, with the labels a Kubernetes
    scrape configuration gives an injected pod's series (docs/dashboard.md)."""
    if PROMETHEUS is None:
        pytest.fail(
            "no prometheus binary: make system-deps installs it (apt-get install prometheus)"
        )
    port = free_port()
    target = {
        "targets": [f"127.0.0.1:{sidecar.envoy.admin_port}"],
        "labels": {"namespace": "shop", "trellis_service": "client", "pod": "client-0"},
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "sidecars", "metrics_path": "/stats/prometheus",
             "static_configs": [target]}
        ],
    }  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(20)
        log.close()


def _get(url: str) -> Any:
    try:
        answer = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return None
    return answer.json() if answer.status_code == 200 else None


def _scraped(prometheus: str) -> bool:
    query = f'envoy_cluster_upstream_rq_total{{envoy_cluster_name="{WEB}"}}'
    found = _get(f"{prometheus}/api/v1/query?query={query}")
    return bool(found and found["data"]["result"])


@pytest.fixture
def page(tmp_path: Path, prometheus: str) -> Iterator[str]:
    """``trellis dashboard --prometheus-url`` as a user runs it, with no mesh anywhere."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "TRELLIS_ADMIN_TOKEN")}
    env["HOME"] = str(tmp_path)  # no ~/.kube/config
    argv = [
        sys.executable, "-m", "trellis_cli.main", "--state-dir", str(tmp_path / "no-mesh"),
        "dashboard", "--no-open", "--port", str(port), "--interval", "0.5",
        "--prometheus-url", prometheus, "--prometheus-window", "30s",
    ]  # fmt: skip
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield f"http://127.0.0.1:{port}/api/mesh"
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
        assert b"Traceback" not in stderr, stderr.decode()


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_the_page_shows_prometheus_edges_with_rates_denials_and_mtls(
    sidecar: Any, prometheus: str, page: str
) -> None:
    await eventually(lambda: _scraped(prometheus), timeout=60, message="no scrape of Envoy")
    sidecar.send(routed=10, unrouted=4)

    def moving() -> Any:
        picture = _get(page)
        if not picture or picture.get("generated_at") is None:
            return None
        edges = {(e["source"], e["destination"]): e for e in picture["edges"]}
        web, denied = edges.get(("shop/client", "shop/web")), edges.get(("shop/client", DENIED))
        # the latency histogram reaches /stats/prometheus at Envoy's next flush (5 s)
        moved = web and web["requests"] == 10 and web["rps"] and web["p99_ms"] is not None
        if moved and denied and denied["denied_rps"]:
            return {**edges, ("picture", ""): picture}
        return None

    edges = await eventually(moving, timeout=60, message="no edge with a rate on the page")
    picture = edges[("picture", "")]
    assert picture["source"]["kind"] == "prometheus"
    assert picture["source"]["url"] == prometheus
    web = edges[("shop/client", "shop/web")]
    assert web["success_rate"] == 1.0
    assert web["p50_ms"] is not None
    assert web["tls"] == "plaintext"
    assert edges[("shop/client", "shop/db")]["mtls"] is True  # a cluster with a client cert
    denied = edges[("shop/client", DENIED)]
    assert denied["requests"] == 4
    assert denied["success_rate"] == 0.0
    # no mesh to read policy from: the page says so, and still draws the traffic
    assert any(e.startswith("catalog: ") for e in picture["errors"]), picture["errors"]
    assert {s["id"] for s in picture["services"]} >= {"shop/client", "shop/web", DENIED}
