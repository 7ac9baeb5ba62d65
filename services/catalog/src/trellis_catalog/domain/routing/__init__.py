"""Gateway API: routes attached to Services (GAMMA) and to Trellis' Gateways, their
listeners, ReferenceGrants and statuses, and the TCP ports several destinations share.

Reads the known services (:mod:`~trellis_catalog.domain.index`); who may call whom is
decided above it, in :mod:`~trellis_catalog.domain.access`.
"""
