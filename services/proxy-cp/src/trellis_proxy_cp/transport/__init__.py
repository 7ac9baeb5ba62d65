"""Transports: the ADS servers (state of the world, delta) and the admin REST routes."""
