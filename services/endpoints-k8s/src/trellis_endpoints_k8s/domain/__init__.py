"""Pure translation of Kubernetes objects into the provider's services (no client, no I/O)."""
