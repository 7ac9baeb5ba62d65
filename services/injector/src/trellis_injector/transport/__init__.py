"""injector transports: the onboarding REST API (the Kubernetes webhook comes later)."""
