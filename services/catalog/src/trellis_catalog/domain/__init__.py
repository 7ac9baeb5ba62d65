"""Pure catalog logic: the indexed specification, clusters and per-identity policy.

Five floors, each importing only the ones below it (the "catalog domain layers" contract in
the root ``pyproject.toml``, checked by ``make imports``); the spec model itself is the
``trellis_spec`` library, under all of them:

- :mod:`.changes`: from what changed in the inputs to what must be computed again
  (documents, access-only edits, the recompute);
- :mod:`.publish`: what the catalog publishes to proxy-cp, versioned (resources,
  destinations);
- :mod:`.access`: who may call whom, and how (an identity's policy, inbound and IngressBackend,
  Egress, UpstreamTrafficSettings, CheckPolicy's explanation);
- :mod:`.routing`: Gateway API routes and Gateways, and TCP ports shared by destinations;
- :mod:`.index`: the known services, their clusters, the providers' reports, the proxies;
- :mod:`.model`: the frozen values the catalog answers with, and their content versions.
"""
