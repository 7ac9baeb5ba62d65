"""Prometheus metrics of the injector, on the registry the service passes in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from trellis_common.metrics import MetricFactory


class InjectorMetrics:
    """Made once per service, on the registry it passes in."""

    def __init__(self, registry: CollectorRegistry) -> None:
        make = MetricFactory(registry, "trellis_injector")
        self.onboarded = make.counter(
            "proxies_onboarded", "Proxies onboarded, by credential (admin or token)", "caller"
        )
        self.refusals = make.counter(
            "onboarding_refusals",
            "Onboarding requests refused for their credential, by reason (no-token, "
            "malformed-token, unknown-token, expired, wrong-identity)",
            "reason",
        )
        self.tokens = make.counter(
            "onboarding_tokens",
            "Onboarding tokens created, revoked, and refused at creation",
            "event",
        )
