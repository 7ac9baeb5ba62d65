"""Prometheus metrics of proxy-cp, on the registry the service passes in."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry

from trellis_runtime.metrics import MetricFactory


class XdsMetrics:
    """Made once per service, on the registry it passes in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        make = MetricFactory(registry, "trellis_proxy_cp")
        self.make = make
        self.connected = make.gauge("connected_proxies", "Open ADS streams", "protocol")
        self.streams = make.counter("streams", "ADS streams opened", "protocol")
        self.pushes = make.counter("pushes", "xDS responses sent", "type")
        self.acks = make.counter("acks", "xDS ACKs", "type")
        self.nacks = make.counter("nacks", "xDS NACKs", "type")
        self.push_latency = make.histogram(
            "push_latency_seconds",
            "From a snapshot being set to the proxy ACKing it",
            "type",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        self.translations = make.counter(
            "translations",
            "Kinds of resource translated for a group's snapshot (listeners, routes, clusters, "
            "endpoints, secrets): a change translates only the kinds it concerns",
            "kind",
        )
        self.refused_snapshots = make.counter(
            "refused_snapshots", "Snapshots refused by the consistency check (last good kept)"
        )
        self.refused_streams = make.counter(
            "refused_streams",
            "Streams refused or ended by proxy-cp, by gRPC code and reason (not_expected, "
            "node_metadata_too_large, too_many_names, name_too_long, replaced, ...)",
            "code",
            "reason",
        )
        self.renewals = make.counter(
            "renewals",
            "Proxy certificate renewals (ProxyCertificates/Renew), by outcome: renewed, or the "
            "refusal's reason (revoked, stale_serial, other_proxy, invalid_csr, ...)",
            "outcome",
        )
        self.enrollments = make.counter(
            "enrollments",
            "Pod proxy enrollments (ProxyEnrollment/Enroll), by outcome: enrolled, or the "
            "refusal's reason (no_token, not_bound, wrong_audience, control_plane_namespace, "
            "bad_csr, certmanager_unavailable, ...)",
            "outcome",
        )

    def translated(self, kinds: Iterable[str]) -> None:
        """One group's snapshot built: count the kinds translated for it."""
        for kind in kinds:
            self.translations.labels(kind).inc()
