"""trellis_cli."""
