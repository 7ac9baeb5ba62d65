"""Generate the Grafana dashboards in ``deploy/grafana/`` (or check they are up to date).

Three dashboards, each a Grafana JSON model with a Prometheus data source variable:

- **Trellis mesh overview**: every sidecar's Envoy statistics (``/stats/prometheus`` on the
  sidecars' stats port, scraped through the pods' ``prometheus.io/*`` annotations): request
  and error rates and latency by destination cluster, connections, RBAC denials, 404s.
- **Trellis service**: the golden signals of one service (``$cluster``, a destination
  cluster ``<namespace>/<service>|<port>``) as its clients see it.
- **Trellis control plane**: the services' own ``/metrics``: connected proxies, pushes,
  ACK/NACK, push latency, refusals, certificates, loops down, rejected records, and
  how long each service's event loop was held.

``tests/deploy/test_dashboards.py`` checks every metric an expression names against what a
running mesh really exports. ``make dashboards`` writes them; ``make test`` checks they match.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "deploy" / "grafana"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"


def rate(metric: str, match: str = "") -> str:
    return f"rate({metric}{match}{RATE})"


def per(labels: str, expr: str) -> str:
    return f"sum by ({labels}) ({expr})"


def p99(metric: str, labels: str, match: str = "", quantile: str = "0.99") -> str:
    return f"histogram_quantile({quantile}, {per(labels, rate(metric, match))})"


def panel(
    title: str, exprs: dict[str, str], unit: str = "short", kind: str = "timeseries"
) -> dict[str, Any]:
    return {
        "type": kind,
        "title": title,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "datasource": DATASOURCE,
            }
            for i, (legend, expr) in enumerate(exprs.items())
        ],
    }


def dashboard(
    uid: str,
    title: str,
    panels: list[dict[str, Any]],
    variables: tuple[dict[str, Any], ...] = (),
) -> dict[str, Any]:
    placed = [
        {**item, "id": i + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}}
        for i, item in enumerate(panels)
    ]
    return {
        "uid": uid,
        "title": title,
        "tags": ["trellis"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                },
                *variables,
            ]
        },
        "panels": placed,
    }


CLUSTER = "envoy_cluster_name"
INBOUND = '{envoy_http_conn_manager_prefix="inbound"}'  # Envoy's tag for http.inbound.*
RQ = "envoy_cluster_upstream_rq_total"


def mesh_overview() -> dict[str, Any]:
    five = '{envoy_response_code_class="5"}'
    return dashboard(
        "trellis-mesh",
        "Trellis mesh overview",
        [
            panel(
                "Requests per second by destination",
                {"{{envoy_cluster_name}}": per(CLUSTER, rate(RQ))},
                "reqps",
            ),
            panel(
                "5xx share by destination",
                {
                    "{{envoy_cluster_name}}": per(
                        CLUSTER, rate("envoy_cluster_upstream_rq_xx", five)
                    )
                    + " / "
                    + per(CLUSTER, rate(RQ))
                },
                "percentunit",
            ),
            panel(
                "p99 latency by destination",
                {
                    "{{envoy_cluster_name}}": p99(
                        "envoy_cluster_upstream_rq_time_bucket", f"le, {CLUSTER}"
                    )
                },
                "ms",
            ),
            panel(
                "Open connections by destination",
                {"{{envoy_cluster_name}}": per(CLUSTER, "envoy_cluster_upstream_cx_active")},
            ),
            panel(
                "Refused by policy (RBAC 403) per second",
                {
                    "denied": f"sum({rate('envoy_http_rbac_denied', INBOUND)})",
                    "allowed": f"sum({rate('envoy_http_rbac_allowed', INBOUND)})",
                },
                "reqps",
            ),
            panel(
                "Circuit breaking and retries per second",
                {
                    "over maxRequests": per(
                        CLUSTER, rate("envoy_cluster_upstream_rq_active_overflow")
                    ),
                    "over maxPendingRequests": per(
                        CLUSTER, rate("envoy_cluster_upstream_rq_pending_overflow")
                    ),
                    "retries": per(CLUSTER, rate("envoy_cluster_upstream_rq_retry")),
                },
                "reqps",
            ),
        ],
    )


def service() -> dict[str, Any]:
    match = '{envoy_cluster_name="$cluster"}'
    variable = {
        "name": "cluster",
        "type": "query",
        "label": "Destination",
        "datasource": DATASOURCE,
        "query": {"query": f"label_values({RQ}, {CLUSTER})", "refId": "cluster"},
        "refresh": 2,
    }
    return dashboard(
        "trellis-service",
        "Trellis service",
        [
            panel("Traffic: requests per second", {"requests": f"sum({rate(RQ, match)})"}, "reqps"),
            panel(
                "Errors: responses by class per second",
                {
                    "{{envoy_response_code_class}}xx": per(
                        "envoy_response_code_class", rate("envoy_cluster_upstream_rq_xx", match)
                    )
                },
                "reqps",
            ),
            panel(
                "Latency: p50, p90, p99",
                {
                    f"p{q}": p99("envoy_cluster_upstream_rq_time_bucket", "le", match, f"0.{q}")
                    for q in (50, 90, 99)
                },
                "ms",
            ),
            panel(
                "Saturation: open connections and endpoints",
                {
                    "connections": f"sum(envoy_cluster_upstream_cx_active{match})",
                    "healthy endpoints": f"sum(envoy_cluster_membership_healthy{match})",
                },
            ),
        ],
        (variable,),
    )


def control_plane() -> dict[str, Any]:
    return dashboard(
        "trellis-control-plane",
        "Trellis control plane",
        [
            panel(
                "Connected proxies",
                {"{{protocol}}": per("protocol", "trellis_proxy_cp_connected_proxies")},
            ),
            panel(
                "xDS pushes, ACKs and NACKs per second",
                {
                    "pushes {{type}}": per("type", rate("trellis_proxy_cp_pushes_total")),
                    "ACKs {{type}}": per("type", rate("trellis_proxy_cp_acks_total")),
                    "NACKs {{type}}": per("type", rate("trellis_proxy_cp_nacks_total")),
                },
                "ops",
            ),
            panel(
                "Push to ACK latency, p99",
                {"{{type}}": p99("trellis_proxy_cp_push_latency_seconds_bucket", "le, type")},
                "s",
            ),
            panel(
                "Refusals per second",
                {
                    "xDS streams {{reason}}": per(
                        "reason", rate("trellis_proxy_cp_refused_streams_total")
                    ),
                    "internal gRPC {{reason}}": per("reason", rate("trellis_grpc_refusals_total")),
                    "Destination API {{reason}}": per(
                        "reason", rate("trellis_proxy_cp_destination_refused_total")
                    ),
                },
                "ops",
            ),
            panel(
                "Certificates held", {"{{kind}}": per("kind", "trellis_certmanager_certificates")}
            ),
            panel(
                "Loops down and records rejected",
                {
                    "down {{loop}}": per("loop", "trellis_loop_down"),
                    "rejected {{source}}": per("source", "trellis_rejected_records_current"),
                },
            ),
            panel(
                "Destination API streams",
                {"{{rpc}}": per("rpc", "trellis_proxy_cp_destination_streams")},
            ),
            panel(
                "Event loop held, worst over a minute",
                {"{{instance}}": per("instance", "trellis_event_loop_lag_max_seconds")},
                "s",
            ),
        ],
    )


DASHBOARDS = {
    "mesh-overview.json": mesh_overview,
    "service.json": service,
    "control-plane.json": control_plane,
}


def render() -> dict[str, str]:
    return {
        name: json.dumps(make(), indent=2, sort_keys=True) + "\n"
        for name, make in DASHBOARDS.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    args = parser.parse_args()
    rendered = render()
    if args.check:
        stale = [
            n
            for n, text in rendered.items()
            if not (OUT / n).is_file() or (OUT / n).read_text() != text
        ]
        if stale:
            print("stale dashboards (run `make dashboards`):", *stale, file=sys.stderr)
            return 1
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in rendered.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(rendered)} dashboards to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
