"""From what changed in the inputs to what must be computed again: the spec's documents and
their changes, what an access-only edit touches, and the recompute that rebuilds services,
clusters, policies and destinations.

The top floor of the domain: :mod:`trellis_catalog.catalog` drives it.
"""
