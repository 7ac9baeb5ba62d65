"""trellis_api."""
