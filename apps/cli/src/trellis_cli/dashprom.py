"""The dashboard's traffic from Prometheus: the sidecars' Envoy series, as Prometheus keeps
them (``trellis dashboard --prometheus-url``).

Every injected sidecar serves ``/stats/prometheus`` on its stats port (15010, annotated
``prometheus.io/scrape``), so a Prometheus that scrapes the mesh already holds what the
admin-API sources read from each sidecar. Prometheus scrapes every 15-60 s, so differences
between two of the dashboard's reads would be mostly zeros: the rates are Prometheus' own,
``increase()`` over a window (``--prometheus-window``, 1m by default), handed to the same
:class:`~trellis_cli.meshedges.EdgeBuilder` as two scrapes of a sidecar are. One instant
query per figure, all at the same evaluation time, each over the mesh's outbound clusters
only (``<namespace>/<service>|<port>``):

=========================  ===========================================================
figure                     series (Envoy's Prometheus names, with their tags as labels)
=========================  ===========================================================
requests                   ``envoy_cluster_upstream_rq_total`` (and its increase)
completed                  ``envoy_cluster_upstream_rq_completed``
5xx, 403                   ``envoy_cluster_upstream_rq_xx{envoy_response_code_class="5"}``,
                           ``envoy_cluster_upstream_rq{envoy_response_code="403"}``
connect failures           ``envoy_cluster_upstream_cx_connect_fail``
no route (denied)          ``envoy_http_no_route{envoy_http_conn_manager_prefix="outbound"}``
p50, p99                   ``histogram_quantile`` of ``envoy_cluster_upstream_rq_time_bucket``
mTLS                       ``envoy_cluster_ssl_handshake``: Envoy makes a cluster's ssl
                           statistics only for a TLS transport socket, and proxy-cp gives
                           every mesh cluster with TLS the proxy's certificate (mTLS)
=========================  ===========================================================

A series names its sidecar by the labels the scrape gave it, not by the sidecar's bootstrap
(Envoy's statistics do not carry its ``node.cluster``): the caller is
``<namespace>/<service>``, the namespace from ``namespace`` (or ``kubernetes_namespace``),
the service from ``trellis_service``, ``app_kubernetes_io_name`` or ``app``, as the
injector picks it. A series without them is named by its ``pod`` or ``instance``, and the
page says how many such sidecars there are (docs/dashboard.md has the relabelling).
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from trellis_cli import dashsources, meshedges
from trellis_cli.dashsources import Reading

NAMESPACE_LABELS = ("namespace", "kubernetes_namespace")
SERVICE_LABELS = ("trellis_service", "app_kubernetes_io_name", "app")
#: The mesh's outbound clusters (``meshedges.destination``), as a PromQL label matcher.
MESH = 'envoy_cluster_name=~"[^/|]+/[^/|]+[|][0-9]+"'
NO_ROUTE = 'envoy_http_no_route{envoy_http_conn_manager_prefix="outbound"}'
#: counter -> its series (over the mesh's clusters): what moved over the window.
COUNTERS = {
    "upstream_rq_total": f"envoy_cluster_upstream_rq_total{{{MESH}}}",
    "upstream_rq_completed": f"envoy_cluster_upstream_rq_completed{{{MESH}}}",
    "upstream_rq_5xx": f'envoy_cluster_upstream_rq_xx{{{MESH},envoy_response_code_class="5"}}',
    "upstream_rq_403": f'envoy_cluster_upstream_rq{{{MESH},envoy_response_code="403"}}',
    "upstream_cx_connect_fail": f"envoy_cluster_upstream_cx_connect_fail{{{MESH}}}",
}
QUANTILES = {"p50": 0.5, "p99": 0.99}
_WINDOW = re.compile(r"^(?P<count>[1-9][0-9]*)(?P<unit>[smh])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600}


class PrometheusError(Exception):
    """Prometheus refused or failed a query; the message says which and why."""


def window_seconds(text: str) -> int:
    """``30s``, ``1m``, ``2h`` -> seconds; ValueError naming the accepted form otherwise."""
    match = _WINDOW.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 30s, 1m or 5m")
    return int(match.group("count")) * _SECONDS[match.group("unit")]


def queries(window: str) -> dict[str, str]:
    """Every instant query of one reading, by what it stands for."""
    found = {f"total:{name}": series for name, series in COUNTERS.items()}
    found |= {f"moved:{name}": f"increase({series}[{window}])" for name, series in COUNTERS.items()}
    found["total:no_route"] = NO_ROUTE
    found["moved:no_route"] = f"increase({NO_ROUTE}[{window}])"
    bucket = f"envoy_cluster_upstream_rq_time_bucket{{{MESH}}}"
    for label, q in QUANTILES.items():
        found[f"latency:{label}"] = f"histogram_quantile({q}, rate({bucket}[{window}]))"
    found["tls"] = f"envoy_cluster_ssl_handshake{{{MESH}}}"
    return found


def identity(labels: dict[str, str]) -> tuple[str, bool]:
    """The sidecar's ``<namespace>/<service>``, and whether its labels said it."""
    namespace = next((labels[k] for k in NAMESPACE_LABELS if labels.get(k)), "")
    service = next((labels[k] for k in SERVICE_LABELS if labels.get(k)), "")
    if namespace and service:
        return f"{namespace}/{service}", True
    return labels.get("pod") or labels.get("instance") or "(unlabelled sidecar)", False


def _value(series: dict[str, Any]) -> float | None:
    try:
        value = float(series["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@dataclass
class _Sidecar:
    identity: str
    labelled: bool
    totals: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    moved: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    latency: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    tls: dict[str, str] = field(default_factory=dict)
    no_route: int = 0
    no_route_moved: float = 0.0


def assemble(results: dict[str, list[dict[str, Any]]], seconds: float) -> Reading:
    """The reading of one set of query results (``queries``' keys -> result vectors):
    pure, so the page's figures can be checked against fixtures of real Envoy series."""
    sidecars: dict[str, _Sidecar] = {}
    for key, vector in results.items():
        kind, _, name = key.partition(":")
        for series in vector:
            labels = {str(k): str(v) for k, v in (series.get("metric") or {}).items()}
            value = _value(series)
            if value is None:
                continue
            who, labelled = identity(labels)
            sidecar_key = f"{labels.get('instance', '')} {labels.get('pod', '')} {who}"
            sidecar = sidecars.setdefault(sidecar_key, _Sidecar(who, labelled))
            cluster = labels.get("envoy_cluster_name", "")
            if name == "no_route":
                if kind == "total":
                    sidecar.no_route += int(value)
                else:
                    sidecar.no_route_moved += value
            elif kind == "total":
                sidecar.totals[cluster][name] = int(value)
            elif kind == "moved":
                sidecar.moved[cluster][name] = value
            elif kind == "latency":
                sidecar.latency[cluster][name] = value  # ms: Envoy's buckets
            elif kind == "tls":
                sidecar.tls[cluster] = "mtls"
    built = meshedges.EdgeBuilder()
    samples = []
    for key, sidecar in sorted(sidecars.items()):
        clusters = {}
        for name in sorted({*sidecar.totals, *sidecar.moved}):
            stats = meshedges.ClusterStats(
                counters=dict(sidecar.totals.get(name, {})),
                p50=sidecar.latency.get(name, {}).get("p50"),
                p99=sidecar.latency.get(name, {}).get("p99"),
            )
            clusters[name] = stats
            tls = sidecar.tls.get(name, "plaintext")
            built.cluster(sidecar.identity, name, stats, tls, sidecar.moved.get(name), seconds)
        built.no_route(sidecar.identity, sidecar.no_route, sidecar.no_route_moved, seconds)
        read = meshedges.SidecarStats(clusters=clusters, no_route=sidecar.no_route)
        samples.append(meshedges.Sample(key.strip(), sidecar.identity, read, dict(sidecar.tls)))
    unlabelled = sum(1 for s in sidecars.values() if not s.labelled)
    source = {"kind": "prometheus", "sidecars": len(sidecars), "unlabelled": unlabelled}
    errors = (
        [
            f"prometheus: {unlabelled} sidecar(s) have no namespace and service labels and "
            "are named by their pod or instance (see docs/dashboard.md: relabelling)"
        ]
        if unlabelled
        else []
    )
    return Reading(samples, errors, edges=built.edges(), source=source)


class PrometheusSource:
    """Reads the sidecars' series from the Prometheus HTTP API at ``url``."""

    def __init__(self, url: str, window: str = "1m") -> None:
        self.url, self.window = url.rstrip("/"), window
        self.seconds = window_seconds(window)
        self._last = Reading([], [], edges=[])  # shown, with the error, when a read fails

    def query(self, http: httpx.Client, promql: str, at: float) -> list[dict[str, Any]]:
        try:
            answer = http.get(f"{self.url}/api/v1/query", params={"query": promql, "time": at})
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{self.url} is not reachable: {exc!r}") from exc
        try:
            body = answer.json()
        except ValueError:
            raise PrometheusError(
                f"{self.url} answered {answer.status_code} with no Prometheus API JSON: "
                f"{answer.text[:120]!r}"
            ) from None
        if not isinstance(body, dict) or body.get("status") != "success":
            reason = body.get("error", body) if isinstance(body, dict) else body
            raise PrometheusError(f"query {promql!r} failed ({answer.status_code}): {reason}")
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise PrometheusError(f"query {promql!r}: a {data.get('resultType')}, not a vector")
        return list(data.get("result") or [])

    def read(self) -> Reading:
        at = time.time()
        results = {}
        try:
            with dashsources.client() as http:
                for key, promql in queries(self.window).items():
                    results[key] = self.query(http, promql, at)
        except PrometheusError as exc:
            last = self._last
            error = f"prometheus: {exc} (showing the last answer)"
            return Reading(last.samples, [error], last.edges, {**last.source, **self._source()})
        reading = assemble(results, self.seconds)
        self._last = Reading(
            reading.samples, reading.errors, reading.edges, {**reading.source, **self._source()}
        )
        return self._last

    def _source(self) -> dict[str, Any]:
        return {"kind": "prometheus", "url": self.url, "window": self.window}
