"""Trellis endpoints-k8s: Kubernetes Services and their endpoints, for the catalog."""
