"""Clients of the other services: endpoints providers and certmanager."""
