"""Versioned snapshots of Envoy resources per proxy group, checked and serialized once."""
