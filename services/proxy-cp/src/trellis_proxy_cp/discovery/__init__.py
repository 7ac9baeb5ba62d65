"""The Linkerd Destination API (server.py) and its admin routes (rest.py)."""
