"""trellis_common."""
