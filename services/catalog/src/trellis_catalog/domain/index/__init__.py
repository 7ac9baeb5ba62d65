"""What the catalog knows of the mesh's workloads: the known services (declared Services
merged with the providers' reports), their clusters, the provider merge and the proxies.

Imports only :mod:`~trellis_catalog.domain.model`; knows nothing of routes or policy.
"""
