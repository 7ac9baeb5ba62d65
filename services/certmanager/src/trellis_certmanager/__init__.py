"""trellis_certmanager."""
