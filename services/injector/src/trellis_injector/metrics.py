"""Prometheus metrics of the injector, on the registry the service passes in."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from trellis_runtime.metrics import MetricFactory


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
        self.admissions = make.counter(
            "admissions",
            "AdmissionReviews answered, by outcome (injected, skipped_opt_out, "
            "skipped_already, skipped_host_network, ignored, denied_invalid, error)",
            "outcome",
        )
        self.malformed = make.counter(
            "admission_malformed", "Webhook requests refused with 400: not an AdmissionReview"
        )
        self.admission_seconds = make.histogram(
            "admission_seconds",
            "Time to answer an AdmissionReview",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.webhook_refused = make.counter(
            "webhook_refused",
            "Webhook calls refused as not the API server's: no_client_certificate, "
            "unexpected_client",
            "reason",
        )
        self.ca_bundle_patches = make.counter(
            "ca_bundle_patches",
            "caBundle updates of the MutatingWebhookConfiguration: patched, unchanged, "
            "missing, failed",
            "outcome",
        )
