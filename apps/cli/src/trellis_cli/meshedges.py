"""The mesh's edges from its sidecars' Envoy statistics: pure functions, no I/O.

An edge is a caller's service identity and a destination service. Its figures come from
the caller's sidecar, as linkerd viz takes them from the client's proxy:

- each outbound cluster (``<namespace>/<service>|<port>``) counts the requests sent to
  that service and how they ended (``upstream_rq_2xx``... ``upstream_rq_403``: the
  destination's sidecar refused the caller by policy), and holds a histogram of their
  latency (``upstream_rq_time``, whose quantiles Envoy computes over its last flush
  interval);
- the cluster's transport socket says whether the caller presents its certificate
  (mTLS), only checks the server's (TLS), or sends in the clear;
- requests the mesh gave the caller no route for (``http.outbound.no_route``: it may not
  reach what it asked for, as the demo's bookthief) are an edge to :data:`DENIED`, since
  the sidecar never learns which service was meant.

Counters only grow, so rates are the difference between two scrapes over the time between
them (:class:`EdgeRates`); a counter that went down is a restarted sidecar, counted from 0.
Several sidecars of one identity add up into one edge.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: The destination of requests the caller's sidecar had no route for (denied by policy).
DENIED = "(denied: no route)"
_CLUSTER = re.compile(r"^cluster\.(?P<cluster>[^.]+)\.(?P<stat>[a-z0-9_]+)$")
_SERVICE_CLUSTER = re.compile(r"^(?P<service>[^/|]+/[^/|]+)\|\d+$")
_QUANTILES = {"p50": 50.0, "p99": 99.0}
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext"


@dataclass(frozen=True)
class ClusterStats:
    """One outbound cluster's counters and latency quantiles (ms; None: no request in the
    last interval)."""

    counters: Mapping[str, int]
    p50: float | None = None
    p99: float | None = None


@dataclass(frozen=True)
class SidecarStats:
    clusters: Mapping[str, ClusterStats]
    no_route: int = 0


@dataclass(frozen=True)
class Sample:
    """One scrape of one sidecar."""

    sidecar: str  # its admin URL
    identity: str  # "<namespace>/<service>"
    stats: SidecarStats
    tls: Mapping[str, str]  # cluster -> "mtls" | "tls" | "plaintext"


def destination(cluster: str) -> str | None:
    """The service an outbound cluster leads to (``bookstore/bookstore-v1|14001`` ->
    ``bookstore/bookstore-v1``); None for the mesh's own (``trellis-xds``, ``inbound|..``)."""
    match = _SERVICE_CLUSTER.match(cluster)
    return match.group("service") if match else None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def read_stats(body: Mapping[str, Any]) -> SidecarStats:
    """Envoy's ``/stats?format=json`` (counters, and histograms as computed quantiles)."""
    counters: dict[str, dict[str, int]] = {}
    quantiles: dict[str, dict[str, float | None]] = {}
    no_route = 0
    for stat in body.get("stats", []):
        if "histograms" in stat:
            histograms = stat["histograms"]
            supported = [float(q) for q in histograms.get("supported_quantiles", [])]
            for histogram in histograms.get("computed_quantiles", []):
                match = _CLUSTER.match(histogram.get("name", ""))
                if match is None or match.group("stat") != "upstream_rq_time":
                    continue
                values = histogram.get("values", [])
                found: dict[str, float | None] = {}
                for label, wanted in _QUANTILES.items():
                    position = supported.index(wanted) if wanted in supported else -1
                    found[label] = (
                        _number(values[position].get("interval"))
                        if 0 <= position < len(values)
                        else None
                    )
                quantiles[match.group("cluster")] = found
            continue
        name, value = stat.get("name", ""), stat.get("value")
        if not isinstance(value, int):
            continue
        if name == "http.outbound.no_route":
            no_route = value
        match = _CLUSTER.match(name)
        if match is not None:
            counters.setdefault(match.group("cluster"), {})[match.group("stat")] = value
    clusters = {
        name: ClusterStats(
            counters=counts,
            p50=quantiles.get(name, {}).get("p50"),
            p99=quantiles.get(name, {}).get("p99"),
        )
        for name, counts in counters.items()
    }
    return SidecarStats(clusters=clusters, no_route=no_route)


def cluster_tls(config_dump: Mapping[str, Any]) -> dict[str, str]:
    """Each dynamic cluster's transport: ``mtls`` when the sidecar presents a certificate
    (and so proves its identity), ``tls`` when it only checks the server's, else
    ``plaintext``. From ``/config_dump?resource=dynamic_active_clusters``."""
    found = {}
    for config in config_dump.get("configs", []):
        cluster = config.get("cluster", {})
        socket = cluster.get("transport_socket") or {}
        typed = socket.get("typed_config") or {}
        if typed.get("@type") != _TLS:
            found[cluster.get("name", "")] = "plaintext"
            continue
        common = typed.get("common_tls_context") or {}
        presents = common.get("tls_certificate_sds_secret_configs") or common.get(
            "tls_certificates"
        )
        found[cluster.get("name", "")] = "mtls" if presents else "tls"
    return found


@dataclass
class Edge:
    """One caller identity to one destination, added up over the caller's sidecars."""

    source: str
    destination: str
    requests: int = 0  # since the sidecars started
    rps: float | None = None  # None: not two scrapes yet
    success_rate: float | None = None  # None: no request completed between the scrapes
    denied_rps: float = 0.0
    failed_rps: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    tls: str = "plaintext"
    _weights: list[tuple[float, float]] = field(default_factory=list, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "destination": self.destination,
            "requests": self.requests,
            "rps": self.rps,
            "success_rate": self.success_rate,
            "denied_rps": self.denied_rps,
            "failed_rps": self.failed_rps,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "mtls": self.tls == "mtls",
            "tls": self.tls,
        }


def _delta(now: int, before: int | None) -> int:
    """What a counter grew by; one first seen (``before`` None) counts from 0."""
    if before is None:
        return now
    return now - before if now >= before else now  # a restarted sidecar counts from 0


class EdgeBuilder:
    """Adds up what each sidecar's outbound clusters did over a window into per-edge figures.

    ``moved`` is how much each counter grew over the window, and ``seconds`` its length:
    from two scrapes of the sidecar (:class:`EdgeRates`), or Prometheus' ``increase()``
    over a range (:mod:`trellis_cli.dashprom`). Without a window (one scrape so far) an
    edge has its totals and no rates."""

    def __init__(self) -> None:
        self._edges: dict[tuple[str, str], Edge] = {}
        self._completed: dict[tuple[str, str], tuple[float, float]] = {}  # (done, good)

    def edge(self, source: str, target: str, tls: str = "plaintext") -> Edge:
        return self._edges.setdefault((source, target), Edge(source, target, tls=tls))

    def cluster(
        self,
        identity: str,
        name: str,
        stats: ClusterStats,
        tls: str | None,
        moved: Mapping[str, float] | None,
        seconds: float | None,
    ) -> None:
        """One sidecar's outbound cluster ``name``; one of the mesh's own is skipped."""
        target = destination(name)
        if target is None:
            return
        edge = self.edge(identity, target)
        edge.tls = tls or edge.tls
        edge.requests += stats.counters.get("upstream_rq_total", 0)
        if moved is None or not seconds:
            return
        denied = moved.get("upstream_rq_403", 0)
        errors = moved.get("upstream_rq_5xx", 0)
        failed = errors + moved.get("upstream_cx_connect_fail", 0)
        done = moved.get("upstream_rq_completed", 0)
        edge.rps = (edge.rps or 0.0) + moved.get("upstream_rq_total", 0) / seconds
        edge.denied_rps += denied / seconds
        edge.failed_rps += failed / seconds
        total, good = self._completed.get((identity, target), (0, 0))
        self._completed[(identity, target)] = (total + done, good + max(done - denied - errors, 0))
        if stats.p50 is not None:
            edge._weights.append((stats.p50, max(done, 1)))
        if stats.p99 is not None:
            edge.p99_ms = max(edge.p99_ms or 0.0, stats.p99)

    def no_route(
        self, identity: str, total: int, moved: float | None, seconds: float | None
    ) -> None:
        """Requests refused at the caller's sidecar: an edge to :data:`DENIED`, every request
        on it a denial (success 0)."""
        if not total:
            return
        edge = self.edge(identity, DENIED, tls="none")
        edge.requests += total
        if moved is None or not seconds:
            return
        edge.rps = (edge.rps or 0.0) + moved / seconds
        edge.denied_rps += moved / seconds
        edge.success_rate = 0.0 if edge.rps else None

    def edges(self) -> list[Edge]:
        for key, (total, good) in self._completed.items():
            if total:
                self._edges[key].success_rate = good / total
        for edge in self._edges.values():
            if edge._weights:
                weight = sum(w for _, w in edge._weights)
                edge.p50_ms = sum(v * w for v, w in edge._weights) / weight
        return sorted(self._edges.values(), key=lambda e: (e.source, e.destination))


class EdgeRates:
    """Turns successive scrapes into per-edge rates: remembers each sidecar's last counters."""

    def __init__(self) -> None:
        self._previous: dict[str, tuple[float, SidecarStats]] = {}

    def update(self, samples: Iterable[Sample], now: float) -> list[Edge]:
        built = EdgeBuilder()
        for sample in samples:
            before = self._previous.get(sample.sidecar)
            self._previous[sample.sidecar] = (now, sample.stats)
            elapsed = now - before[0] if before is not None and now > before[0] else None
            old = before[1] if before is not None else None
            for name, stats in sample.stats.clusters.items():
                moved = None
                if elapsed is not None and old is not None:
                    previous = old.clusters.get(name)
                    was = previous.counters if previous is not None else {}
                    moved = {
                        stat: float(_delta(count, was.get(stat)))
                        for stat, count in stats.counters.items()
                    }
                built.cluster(sample.identity, name, stats, sample.tls.get(name), moved, elapsed)
            refused = sample.stats.no_route
            moved_refused = (
                float(_delta(refused, old.no_route)) if elapsed is not None and old else None
            )
            built.no_route(sample.identity, refused, moved_refused, elapsed)
        return built.edges()
