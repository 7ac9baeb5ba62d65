"""Kubernetes: reaching the API server, and watching what the mesh reads from it."""
