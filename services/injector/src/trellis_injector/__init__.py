"""trellis_injector: onboarding of proxies (Envoy bootstraps for VMs, later the webhook)."""
