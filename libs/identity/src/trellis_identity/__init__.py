"""trellis_identity: who a component is, and how it proves it.

A component's key, CSR and certificate (:mod:`~trellis_identity.identity`), TLS credentials
and client contexts (:mod:`~trellis_identity.tls`, :mod:`~trellis_identity.trustctx`), the
check of a server's SPIFFE id (:mod:`~trellis_identity.servercheck`), the admin, join and
onboarding tokens, and the authorization of gRPC calls by caller (:mod:`~trellis_identity.authz`).
It builds on ``trellis_common`` only; the runtime (``trellis_runtime``) builds on it.
"""
