"""Prometheus metrics of proxy-cp, on the registry the service passes in."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class XdsMetrics:
    connected: Gauge
    streams: Counter
    pushes: Counter
    acks: Counter
    nacks: Counter
    push_latency: Histogram
    refused_snapshots: Counter
    refused_streams: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry) -> XdsMetrics:
        return cls(
            connected=Gauge(
                "trellis_proxy_cp_connected_proxies",
                "Open ADS streams",
                ["protocol"],
                registry=registry,
            ),
            streams=Counter(
                "trellis_proxy_cp_streams", "ADS streams opened", ["protocol"], registry=registry
            ),
            pushes=Counter(
                "trellis_proxy_cp_pushes", "xDS responses sent", ["type"], registry=registry
            ),
            acks=Counter("trellis_proxy_cp_acks", "xDS ACKs", ["type"], registry=registry),
            nacks=Counter("trellis_proxy_cp_nacks", "xDS NACKs", ["type"], registry=registry),
            push_latency=Histogram(
                "trellis_proxy_cp_push_latency_seconds",
                "From a snapshot being set to the proxy ACKing it",
                ["type"],
                buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
                registry=registry,
            ),
            refused_snapshots=Counter(
                "trellis_proxy_cp_refused_snapshots",
                "Snapshots refused by the consistency check (last good kept)",
                registry=registry,
            ),
            refused_streams=Counter(
                "trellis_proxy_cp_refused_streams",
                "Streams refused or ended by proxy-cp, by gRPC code and reason (not_expected, "
                "node_metadata_too_large, too_many_names, name_too_long, replaced, ...)",
                ["code", "reason"],
                registry=registry,
            ),
        )
